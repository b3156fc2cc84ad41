// Command kvfence-plugin-verbs is the libibverbs transport as a kvfence
// plugin binary (build with -tags rdma; without it the binary starts but
// its transport cannot open a device). A host starts it with sdk.Open.
//
// Settings come from the environment (see verbs.ConfigFromEnv):
// KVFENCE_VERBS_DEVICE, KVFENCE_VERBS_GID, KVFENCE_VERBS_LISTEN,
// KVFENCE_VERBS_TIMEOUT, KVFENCE_VERBS_RETRY_CNT, KVFENCE_VERBS_QUEUE_DEPTH,
// KVFENCE_VERBS_MAX_BATCH, KVFENCE_VERBS_REVOKE (auto|mw1|mr: the fence of
// unbound keys; keys granted to one writer use type-2 windows when the
// device has them), KVFENCE_VERBS_POLL (event|nap|spin),
// KVFENCE_VERBS_TAIL_MARGIN, KVFENCE_LOG_LEVEL.
//
// A bad setting is a usage error: one classified line (invalid-argument) on
// stderr and exit status 2. A transport that cannot start (no device, say)
// exits 1, with its classified reason on stderr.
//
// It owns only wiring (environment to verbs.Config, sdk.Serve); it must
// never hold transfer logic of its own.
package main
