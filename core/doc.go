// Package core owns the writer-lifetime rules of kvfence: when memory that was
// exposed to remote writers may be reused, when a request may be handed to
// decode, and when a prefill rank may say that its writes stopped.
//
// It is a set of pure state machines in the style of etcd's raft: a Receiver
// (one decode rank) and a Sender (one prefill rank). Inputs are engine calls,
// received control messages, transport completions and ticks; every input
// carries the current time of the caller's clock. Outputs are values that the
// caller acts on (messages to send, posts, quiesce and revoke requests,
// handoffs, releases), collected in an Output that stays valid until the next
// input.
//
// core must never do I/O, start goroutines, read a clock or import another
// kvfence package except errdefs and core/knownunsafe, and never branch on a
// known-unsafe variant: at each decision a variant changes it asks its
// policy (policy.go), which is the safe one unless the simulation, a test or
// a -tags kvfenceunsafe agent linked internal/unsafecore. Holds
// belong to the core, not to request objects: no engine call releases exposed
// memory except through drained, fenced or timeout. With a fence (the
// transport can revoke), slots go back only after their keys are revoked,
// whatever the ranks' acks say. Time arithmetic saturates, and a declared
// tail above the configured maximum is refused, so that no peer's or
// configuration's duration can wrap a bound into an early release. Where
// the transport cannot revoke, a restart fence (receiver_restart.go) ends a
// hold by restarting the target plugin instance that serves it: its holds go
// back as fenced only once the caller reports the process reaped. Leases are
// renewed per rank (sender_lease.go, receiver_lease.go): a heartbeat carries
// what changed in the rank's list of tags, and decode grants one rank lease
// only over a copy of that list whose count and digest match. In direct
// mode (ReceiverConfig.EnginePages, AdmitAt) the slots are the engine's own
// page indices: the engine names them, the core only lends them, and never
// lends a page whose previous exposure has not been released.
package core
