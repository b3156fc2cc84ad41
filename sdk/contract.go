package sdk

import "context"

// Transport is the required contract every kvfence plugin implements
// (docs/design.md §5). It is deliberately small; optional abilities are separate interfaces
// (Granter, StatsReporter) detected at run time, as database/sql/driver does.
//
// Errors returned by any method must be *Error values (see Errorf), so that
// their Class survives the trip through gRPC. A method that returns an error
// changed nothing, with one exception spelled out on Quiesce.
//
// The rules that make the isolation promise hold:
//
//   - Post is non-blocking. If it returns nil, the batch is accepted and the
//     transport owes exactly one terminal Completion for it on the channel
//     returned by Completions — never zero, never two. If Post returns an
//     error, nothing of the batch was or will be moved and no completion is
//     sent. Batch ids are unique for the life of the instance: reusing one
//     is AlreadyExists.
//   - Succeeded means every byte landed AND no attempt of any operation of
//     the batch can still move. A plugin that sends Succeeded on "the backend
//     returned OK" while the backend may still resend a slice is lying.
//   - FailedDefinite needs proof that nothing more of the batch can be
//     applied (the receiver refused every unacknowledged operation, the
//     operation never left the process, or Quiesce-grade evidence).
//   - InDoubt is the answer whenever the plugin cannot prove either of the
//     above: a timeout, a lost connection, a backend error whose writes may
//     be retried underneath, an unknown backend status. When unsure, InDoubt.
//   - Quiesce(peer, batches) returns nil only when none of the listed batches
//     (posted to peer) can still move a byte anywhere, and says why in its
//     Evidence. It may tear the connection down to get there (the peer is
//     then reconnected on the next Post). It may take time; it must not lie
//     to finish early: if it cannot obtain evidence it returns an error
//     (typically Unavailable) and the batches stay in doubt. Batches still
//     pending when Quiesce succeeds get their completion (not Succeeded
//     unless every byte was acknowledged) before Quiesce returns.
//   - MaxTail (Info) bounds how long bytes may still land after a batch's
//     completion or failure, absent Quiesce. It must be honest; the core's
//     timeout release depends on it.
type Transport interface {
	// Info names the transport and declares its capabilities.
	Info(ctx context.Context) (Info, error)

	// RegisterMemory makes memory described by desc usable as a local source
	// or destination (and, via Granter, exposable to peers).
	RegisterMemory(ctx context.Context, desc MemoryDesc) (RegionID, error)
	// DeregisterMemory releases a region. A receiving transport revokes every
	// key on the region first (waiting for in-flight writes to stop); a
	// sending transport refuses (FailedPrecondition) while unsent operations
	// still read from the region.
	DeregisterMemory(ctx context.Context, region RegionID) error

	// LocalEndpoint is what peers pass to Connect to reach this transport.
	LocalEndpoint(ctx context.Context) (Endpoint, error)
	// Connect prepares a peer for Post. It may connect lazily.
	Connect(ctx context.Context, ep Endpoint) (PeerID, error)
	// Disconnect forgets a peer. Batches still pending on it become InDoubt
	// unless evidence says otherwise; Quiesce first to resolve them.
	Disconnect(ctx context.Context, peer PeerID) error

	// Post submits a batch of one-sided operations; see the type comment.
	Post(ctx context.Context, b Batch) error
	// Completions is the stream of terminal completions, one per accepted
	// batch. It is closed by Close. There is one stream per transport.
	Completions() <-chan Completion

	// Quiesce returns only when none of batches can still move bytes; see
	// the type comment.
	Quiesce(ctx context.Context, peer PeerID, batches []BatchID) (QuiesceResult, error)

	// Close stops the transport and closes the Completions channel. Pending
	// batches are completed InDoubt first.
	Close() error
}

// Granter is the optional receiving-side capability behind
// Capabilities.Revoke: per-exposure keys that the receiver itself enforces.
//
// Grant exposes a window of a registered region under a new key. Revoke
// returns only after the receiver has stopped applying writes under the key:
// no byte under key lands after Revoke returns nil (a write in progress is cut
// off, which may tear down the connection carrying it). Writes that arrive
// later are dropped, counted, and reported to their sender as refused, so the
// sender can report FailedDefinite for them. Revoking an unknown key is
// NotFound; revoking twice is a no-op.
//
// With Capabilities.WriterBound, a Window naming a Writer yields a key that
// only that writer's connection can use: the same write from any other
// writer ends at its sender as refused (FailedDefinite or InDoubt, never
// Succeeded). A Writer that is not connected is FailedPrecondition; so is
// one connected more than once, where the key binds to one connection
// (verbs: a queue pair) — a transport that binds it to the writer's proven
// identity (tcp: its certificate) accepts any of that writer's connections.
//
// Capabilities.Bounds says how far the receiver holds a write to its key:
// with BoundsWindow or BoundsPieces, a write under a key outside what the
// key's Window covers (Window.Covers: past its end, or, pieced, outside one
// piece) is refused by the receiving side and lands nothing; it ends at its
// sender refused (FailedDefinite or InDoubt, never Succeeded). Only a
// BoundsPieces transport is granted a pieced window; the sdk refuses one
// to any other (Unimplemented) on both sides of the plugin boundary.
// BoundsNone promises nothing beyond the backend's own checks: a key may
// reach every byte its backend lets it (Mooncake, NIXL, MORI check windows
// only at the sender). The conformance check key-bounds-confine-writes
// holds a plugin to its claim.
type Granter interface {
	Grant(ctx context.Context, w Window) (Key, error)
	Revoke(ctx context.Context, key Key) (RevokeResult, error)
}

// StatsReporter is an optional capability: named monotonic counters (for
// example writes dropped after revoke, garbage frames seen) for tests,
// metrics and the conformance suite.
type StatsReporter interface {
	Stats(ctx context.Context) (map[string]uint64, error)
}
