package core

import (
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
)

// DefaultMaxDeclaredTail is the longest tail a prefill rank may declare
// unless ReceiverConfig.MaxDeclaredTail says otherwise. Honest transports
// declare seconds (the TCP plugin's write deadline, an RDMA queue pair's
// retry budget plus margin); five minutes leaves room for slow fabrics while
// keeping the longest hold a peer can cause bounded.
const DefaultMaxDeclaredTail = 5 * time.Minute

// ReceiverConfig configures one decode rank's Receiver.
type ReceiverConfig struct {
	Instance  uint64 // this decode process incarnation; new on every restart
	Self      RankID // this decode rank
	Slots     int    // KV slots in the pool (with EnginePages: the most engine pages lent at once)
	SlotBytes int64  // bytes per slot, for the held-capacity figures
	// EnginePages, when positive, is direct mode: the slots are the
	// engine's own page indices 0..EnginePages-1, named by the caller at
	// AdmitAt (Admit is refused). An engine page lent to an exposure —
	// live, or held after an abort — is refused until its release.
	EnginePages int

	Lease   time.Duration // lease granted by Assign and by each Grant
	MaxHold time.Duration // no lease reaches past admission + MaxHold
	MaxTail time.Duration // this transport's declared tail; a writer's may be longer (RankTail)
	// MaxDeclaredTail is the longest tail a prefill rank may declare
	// (RankTail refuses longer ones): a declared tail extends every timeout
	// hold over that rank's writes, so an unbounded one lets a peer hold
	// memory for ever. Zero means DefaultMaxDeclaredTail (or MaxTail, if
	// that is longer); it may not be shorter than MaxTail.
	MaxDeclaredTail time.Duration
	ClockMargin     time.Duration // at least the largest clock skew between peers

	CanRevoke bool // the transport can revoke keys (receiver-side fence)
	// EagerRevoke: revoke as soon as a tag aborts, to shorten holds — an
	// exposure whose every rank isolates refused writes (RankRefusals);
	// the others are revoked after their drain, as without it.
	EagerRevoke bool
	// AbortRetransmit is how often Abort is resent to ranks that have not
	// acknowledged (messages get lost). Zero means Lease/2.
	AbortRetransmit time.Duration
	// Restarted says that an earlier instance exposed this memory: it is
	// quarantined until revoked or until MaxHold + MaxTail + ClockMargin
	// (longer if a rank declares a longer tail meanwhile: RankTail).
	Restarted bool
	// RestartFence lets holds on a transport that cannot revoke end by
	// restarting the target plugin instance (receiver_restart.go). With it,
	// a rank may declare a tail above MaxDeclaredTail (unbounded): its holds
	// end by that fence, never by timeout.
	RestartFence RestartFenceConfig

	// Unsafe selects a known-unsafe variant. Only the simulation, the tests
	// and -tags kvfenceunsafe agents can run one: its policy is in
	// internal/unsafecore, which a default build does not link.
	Unsafe knownunsafe.Variant
}

func (c *ReceiverConfig) validate() error {
	switch {
	case c.Slots <= 0:
		return errorf(errdefs.InvalidArgument, "Slots must be positive, got %d", c.Slots)
	case c.EnginePages < 0 || c.EnginePages > 1<<31:
		return errorf(errdefs.InvalidArgument, "EnginePages must be 0 (kvfence picks slots) or 1..2^31, got %d", c.EnginePages)
	case c.Lease <= 0:
		return errorf(errdefs.InvalidArgument, "Lease must be positive, got %v", c.Lease)
	case c.MaxHold < c.Lease:
		return errorf(errdefs.InvalidArgument, "MaxHold %v shorter than Lease %v", c.MaxHold, c.Lease)
	case c.MaxTail < 0 || c.ClockMargin < 0:
		return errorf(errdefs.InvalidArgument, "MaxTail and ClockMargin must not be negative")
	case c.MaxDeclaredTail < 0:
		return errorf(errdefs.InvalidArgument, "MaxDeclaredTail must not be negative, got %v", c.MaxDeclaredTail)
	case c.MaxDeclaredTail == 0:
		c.MaxDeclaredTail = max(DefaultMaxDeclaredTail, c.MaxTail)
	case c.MaxDeclaredTail < c.MaxTail:
		return errorf(errdefs.InvalidArgument, "MaxDeclaredTail %v shorter than this receiver's own MaxTail %v: a rank on the same transport would be refused",
			c.MaxDeclaredTail, c.MaxTail)
	}
	if err := c.RestartFence.validate(); err != nil {
		return err
	}
	if c.AbortRetransmit <= 0 {
		c.AbortRetransmit = c.Lease / 2
	}
	return nil
}

// SenderConfig configures one prefill rank's Sender.
type SenderConfig struct {
	Rank RankID
	// Session names this incarnation of the rank in its heartbeats: new on
	// every start (the agent draws it at random), never zero. Decode keeps
	// one heartbeat session per rank and resets it when Session changes.
	Session uint64
	// SkewMargin: the rank stops posting this long before lease_until, so
	// that a rank whose clock lags decode's still stops in time. At least the
	// largest clock skew.
	SkewMargin    time.Duration
	MaxInflight   int           // unsettled batches per rank (bounds the tail)
	MaxBatchPages int           // pages per batch
	Heartbeat     time.Duration // heartbeat period
	// RequestTombstone is how long an aborted, rejected or closed request
	// keeps refusing late Assigns. At least decode's MaxHold + SkewMargin.
	RequestTombstone time.Duration
	// BootstrapTimeout ends an open request that no Assign reached (lost
	// messages, a decode that died): its source pages come back.
	BootstrapTimeout time.Duration

	// Unsafe selects a known-unsafe variant (the self-renewed-lease one
	// carries the lease it gives itself). Only the simulation, the tests
	// and -tags kvfenceunsafe agents can run one: its policy is in
	// internal/unsafecore, which a default build does not link.
	Unsafe knownunsafe.Variant
}

func (c *SenderConfig) validate() error {
	switch {
	case c.Session == 0:
		return errorf(errdefs.InvalidArgument, "Session must not be zero (draw a new one on every start)")
	case c.MaxInflight <= 0:
		return errorf(errdefs.InvalidArgument, "MaxInflight must be positive, got %d", c.MaxInflight)
	case c.MaxBatchPages <= 0:
		return errorf(errdefs.InvalidArgument, "MaxBatchPages must be positive, got %d", c.MaxBatchPages)
	case c.Heartbeat <= 0:
		return errorf(errdefs.InvalidArgument, "Heartbeat must be positive, got %v", c.Heartbeat)
	case c.SkewMargin < 0 || c.RequestTombstone <= 0 || c.BootstrapTimeout <= 0:
		return errorf(errdefs.InvalidArgument, "SkewMargin must not be negative; RequestTombstone and BootstrapTimeout must be positive")
	}
	return nil
}
