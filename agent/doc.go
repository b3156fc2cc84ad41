// Package agent is what a serving engine loads: it drives the pure state
// machines of package core with a real transport (a plugin process opened
// with sdk.Open, or an in-process sdk.Transport), real timers, shared-memory
// KV pools and a gRPC control plane between agents.
//
// It owns: the event loop of each rank (one goroutine owns a core state
// machine; every input — engine call, control message, completion, tick,
// revoke or quiesce result — goes through it), the mapping of core Posts to
// sdk batches and of sdk completions back to core.Completed, per-exposure
// keys on decode (granted per Assign, revoked when the core asks, the result
// fed back as Revoked), the content oracle that lets decode verify every page
// at handoff, the engine-facing API in SGLang's shape (KVReceiver, KVSender,
// a manager per process), metrics and logs.
//
// It must never release exposed memory, hand a request off, or tell a rank
// that its writes stopped on its own: those decisions belong to core. Holds
// live here, not in request objects: dropping a KVReceiver or KVSender never
// drops a hold. It must never accept a control message for a tag from a rank
// that the assignment does not name, and never run with a peer whose
// protocol version or capabilities are weaker than required.
package agent
