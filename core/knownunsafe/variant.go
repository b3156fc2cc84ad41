package knownunsafe

import "time"

// Variant selects one known-unsafe behaviour of the core. The zero value is
// the real, safe core.
type Variant struct {
	name string
	// selfLease is what a rank of the self-renewed-lease variant gives
	// itself on every heartbeat (WithSelfLease); zero for every other.
	selfLease time.Duration
}

var (
	Safe                   = Variant{}
	ReleaseOnAbort         = Variant{name: "release-on-abort"}
	AckAfterFailedSend     = Variant{name: "ack-after-failed-send"}
	IgnoreGenerations      = Variant{name: "ignore-generations"}
	UnboundedTimeout       = Variant{name: "unbounded-timeout"}
	SingleAckTarget        = Variant{name: "single-ack-target"}
	ReleaseOnRemoteFailure = Variant{name: "release-on-remote-failure"}
	NoCoverageCheck        = Variant{name: "no-coverage-check"}
	SelfRenewedLease       = Variant{name: "self-renewed-lease"}
	NoTombstones           = Variant{name: "no-tombstones"}
	RestartReuse           = Variant{name: "restart-reuse"}
	OwnTailOnly            = Variant{name: "own-tail-only"}
	// ReleaseOnDrainAck trusts the ranks' acks with a fence at hand: slots
	// go back on every rank's DrainAck (or the decode loop's finish) before
	// their keys are revoked, so a rank that acks and keeps writing writes
	// into reused memory.
	ReleaseOnDrainAck = Variant{name: "release-on-drain-ack"}
	// ReleaseBeforeReap releases the holds of a target plugin instance as
	// soon as its restart is asked for, before its process is reaped: a
	// write the old process still applies lands in reused memory.
	ReleaseBeforeReap = Variant{name: "release-before-reap"}
	// RankLeaseForgotten drops the rank lease from a tag's bound: when
	// decode stops covering a tag (abort, commit, lapse, resync) its lease
	// stays the one of its Assign instead of freezing at the rank lease
	// the rank posted under, so a timeout release comes before its last
	// writes can land.
	RankLeaseForgotten = Variant{name: "rank-lease-forgotten"}
)

// All lists every unsafe variant, in a stable order.
var All = []Variant{
	ReleaseOnAbort, AckAfterFailedSend, IgnoreGenerations, UnboundedTimeout,
	SingleAckTarget, ReleaseOnRemoteFailure, NoCoverageCheck, SelfRenewedLease,
	NoTombstones, RestartReuse, OwnTailOnly, ReleaseOnDrainAck, ReleaseBeforeReap,
	RankLeaseForgotten,
}

// Name is the variant's stable name ("safe" for the real core).
func (v Variant) Name() string {
	if v.name == "" {
		return "safe"
	}
	return v.name
}

// IsSafe reports whether v is the real core.
func (v Variant) IsSafe() bool { return v.name == "" }

// Is reports whether v is the variant o, whatever parameter either carries.
func (v Variant) Is(o Variant) bool { return v.name == o.name }

// WithSelfLease returns the self-renewed-lease variant giving itself d on
// every heartbeat; any other variant is returned unchanged. The parameter
// lives in the variant, so no production configuration type carries it.
func (v Variant) WithSelfLease(d time.Duration) Variant {
	if v.Is(SelfRenewedLease) {
		v.selfLease = d
	}
	return v
}

// SelfLease is the lease the self-renewed-lease variant gives itself.
func (v Variant) SelfLease() time.Duration { return v.selfLease }

// Parse maps a name back to its variant.
func Parse(name string) (Variant, bool) {
	if name == "safe" || name == "" {
		return Safe, true
	}
	for _, v := range All {
		if v.name == name {
			return v, true
		}
	}
	return Safe, false
}
