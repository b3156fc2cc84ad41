// Package sdk is what a kvfence transport plugin author imports, and what a
// host (the engine's agent) uses to load such a plugin.
//
// It owns: the transport contract (Transport and its optional capability
// interfaces, in the database/sql/driver style: Granter, KeyBatcher for
// many keys a call, StatsReporter), the completion statuses and
// quiescence evidence, carrying error classes (package errdefs, which it
// never renames) across the plugin's gRPC wire, the plugin
// protocol kvfence.transport.v1 over hashicorp/go-plugin (Serve for plugins,
// Open for hosts), the host's crash semantics (a dead plugin's batches become
// InDoubt, then are covered by process-exited evidence once it is reaped),
// the guard that a pieced window (Window.Stride) reaches only a plugin
// declaring Capabilities.Bounds pieces (bounds.go; checked on both sides),
// the helpers that share memory between host and plugin without copies,
// the shared-memory rings that carry Post and Completion (their records and
// doorbells are package sdk/internal/ring, behind this surface; Post asynchronous
// by default, a refusal then being the batch's FailedDefinite completion with
// the refusal's class; OpenOptions.SyncPost or KVFENCE_ASYNC_POST=off for
// the synchronous contract),
// and trust in the binary: a pinned sha256 or a signed conformance
// certificate (CertificatePolicy), checked against a sealed copy that is
// then executed.
//
// It must never: import core (plugins and core are independent), move
// payload bytes through gRPC, invent Succeeded or FailedDefinite on behalf of
// a plugin it cannot hear from, emit more than one terminal completion per
// batch to its caller, or execute a pinned plugin by a path it hashed
// (the file could change between the check and the exec).
package sdk
