// Package agent is the runtime an engine embeds: it drives the pure state
// machines of package core with a real transport (a plugin process opened
// with sdk.Open, or an in-process sdk.Transport), real timers, shared-memory
// KV pools and a gRPC control plane between ranks. Its API is small:
//
//   - Decode side: NewDecode(ctx, DecodeConfig, transport) → *Decode;
//     Decode.NewReceiver(key) → *KVReceiver with Init (expose slots), Poll /
//     Done / Err, Pages (read a handed-off request), Finish, Abort. In
//     direct mode (DecodeConfig.Engine, direct.go) the engine's own memory
//     is registered instead of the pool and InitAt names the engine pages;
//     with EngineMemory.Buffers (one buffer per layer) a page is split
//     across them, one key per buffer (direct_layers.go); with
//     EngineMemory.HostPages, indices past the engine's pages are host
//     landing pages the agent maps (a request's aux and state rows), held
//     by the same rules and read through Pages (direct_host.go).
//   - Prefill side: NewPrefill(ctx, PrefillConfig, transport) → *Prefill;
//     Prefill.NewSender(key) → *KVSender with Init (reserve source pages),
//     Page (memory to fill), Send, Finish, Poll / Done / Err, Abort, Close.
//   - Closing an idle prefill agent: Prefill.QuiesceLink asks decode over
//     the link (link_quiesce.go); once agreed, decode exposes nothing to
//     that rank until ResumeLink or its next link, so no Assign is lost.
//   - PollState: SGLang's KVPoll values (Failed 0 … Success 4). Poll never
//     waits for the agent's loop: the loop publishes a request's state at
//     each change (an engine polls every scheduler iteration; a busy or
//     preempted loop must not stall it), a handed-off request's pages
//     (Pages) before its Success, so a poll that reads Success finds them.
//   - Metrics (Prometheus, one registry per agent) and ServeMetrics; Stats.
//   - The control plane: ranks link themselves (mutual TLS, Hello with
//     ControlVersion and capabilities, sequence numbers); the demo's router
//     may talk to an agent whose config has a router-link handler (set only
//     through internal/routerlink.ServeCommands), over a link
//     that is not public API (internal/routerlink). Errors are classified
//     (package errdefs).
//
// A decode rank and a prefill rank in one program (normally two processes
// on two hosts):
//
//	dec, _ := agent.NewDecode(ctx, agent.DecodeConfig{Rank: 0, Slots: 1024,
//		ShardBytes: 64 << 10, Shards: 1, Lease: 2 * time.Second, MaxHold: 10 * time.Second,
//		Fence: true, ControlAddr: ":7000", TLS: tlsCfg}, decodePlugin.Transport())
//	pre, _ := agent.NewPrefill(ctx, agent.PrefillConfig{Rank: 1, DecodeAddr: "decode-host:7000",
//		SourcePages: 1024, ShardBytes: 64 << 10, MaxInflight: 256, MaxBatchPages: 4,
//		Heartbeat: 200 * time.Millisecond, RequestTombstone: 15 * time.Second,
//		BootstrapTimeout: 10 * time.Second, TLS: tlsCfg}, prefillPlugin.Transport())
//
//	key := core.RequestKey{Room: 42, Gen: 1}
//	rv := dec.NewReceiver(key)
//	if _, err := rv.Init(pages, []core.RankID{1}); errdefs.IsResourceExhausted(err) {
//		// the pool is full (holds count): queue the request and retry
//	}
//	snd := pre.NewSender(key)
//	_ = snd.Init(pages)
//	for i := 0; i < pages; i++ {
//		copy(snd.Page(i), kv[i]) // the engine's KV for page i
//		_ = snd.Send(i + 1)
//	}
//	_ = snd.Finish(pages)
//	<-rv.Done()
//	if rv.Poll() == agent.PollSuccess {
//		use(rv.Pages())
//		rv.Finish() // the slots go back
//	}
//	snd.Close() // the source pages go back once no write can still read them
//
// An engine that cannot order its writes before a request's end (an abort
// may come at any time) fills source pages with Write or Fill instead of
// Page: both refuse once the request ended. Both copy on the caller's
// goroutine, not in the rank's loop (Fill, FillPieces and FillRange in
// FillPiece steps), over pages they pin without the loop: pages the request
// gives back meanwhile stay out of the free list until the copy ends, and
// Abort and Close return only after the step being copied.
//
// It owns: the event loop of each rank (one goroutine owns a core state
// machine; every input — engine call, control message, completion, tick,
// revoke or quiesce result — goes through it), the mapping of core Posts to
// sdk batches and of sdk completions back to core.Completed, per-exposure
// keys on decode (granted per Assign, off the loop, the exposure's
// messages held until they exist and a revocation waiting for them
// (async_grant.go) — per rank, over that rank's shards
// only where the transport's Bounds allow (shard_keys.go), bound to the
// rank's data identity where it declares WriterBound — revoked when the
// core asks, one call per loop turn, the result fed back as Revoked),
// the restart fence's target instances on decode for transports that cannot revoke (restart.go: each
// exposure's keys come from the instance the core bound it to; an instance
// is reaped before TargetRestarted is fed back, never after), the hold log,
// metrics and logs. The demo's router,
// simulated engines and content oracle live in internal/demo, outside the
// runtime; the runtime reaches them only through the router-link handler (a module-internal
// link, internal/routerlink) and the optional ContentCheck hook.
//
// It must never release exposed memory, hand a request off, or tell a rank
// that its writes stopped on its own: those decisions belong to core. Holds
// live here, not in request objects: dropping a KVReceiver or KVSender never
// drops a hold. It must never accept a control message for a tag from a rank
// that the assignment does not name, never run with a peer whose protocol
// version or capabilities are weaker than required, never link to a peer
// other than the role and rank it meant (tls.go), never admit an exposure
// or take an Assign that its pool's layout cannot hold (validate.go), never
// let one peer grow its memory or queues without bound (limits.go: a
// flooding peer is pushed back on, not buffered), never let one
// certificate, or connections that never finish a handshake, hold the
// control port's connections or router links against honest peers
// (admission.go), never start with its own TLS certificate expired, and
// never run a
// known-unsafe core in a binary built without -tags kvfenceunsafe. The
// design it implements is docs/design.md.
package agent
