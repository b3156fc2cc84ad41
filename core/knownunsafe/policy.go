package knownunsafe

import (
	"sync"
	"time"
)

// Policy is every decision of the core that a known-unsafe variant
// changes. The core asks its policy at each such point instead of
// comparing variants, so its production paths hold no unsafe branch: the
// core's own policy (core/policy.go) gives the safe answer everywhere, and
// the unsafe policies live in package internal/unsafecore, which only the
// simulation, the tests and agents built with -tags kvfenceunsafe link.
//
// Each method names the safe rule; the safe answer is true (zero for
// SelfLease). An unsafe policy breaks exactly one rule.
type Policy interface {
	// QuarantineOnRestart: a restarted receiver holds its memory until the
	// earlier instance's writers cannot write any more (restart-reuse
	// breaks it).
	QuarantineOnRestart() bool
	// CountDeclaredTails: a rank's writes are bounded by the tail it
	// declared, not only by the receiver's own (own-tail-only).
	CountDeclaredTails() bool
	// CheckCoverage: a commit that covers fewer pages than the request
	// aborts it (no-coverage-check).
	CheckCoverage() bool
	// AckPerRank: one rank's DrainAck or Commit acks that rank only
	// (single-ack-target).
	AckPerRank() bool
	// WaitOnLocalAbort: a client abort, decode abort or lapsed lease waits
	// for the ranks to drain before memory goes back (release-on-abort).
	WaitOnLocalAbort() bool
	// WaitOnRemoteFailure: so does a failed send, a dead peer or a
	// rejection (release-on-remote-failure).
	WaitOnRemoteFailure() bool
	// FenceBeforeRelease: with a transport that can revoke, slots go back
	// only once their keys are revoked, whatever the acks say
	// (release-on-drain-ack).
	FenceBeforeRelease() bool
	// BoundAbortsByTail: an aborting hold lasts until the last lease plus
	// the tail, never a short fixed timeout (unbounded-timeout).
	BoundAbortsByTail() bool
	// MatchGenerations: a message finds only the exposure of its own
	// instance and generation (ignore-generations).
	MatchGenerations() bool
	// FreezeRankLease: a tag decode stops covering keeps the rank lease
	// the rank posted under as its bound (rank-lease-forgotten).
	FreezeRankLease() bool
	// ReleaseAfterReap: a restart fence's holds go back only once the old
	// process is reaped (release-before-reap).
	ReleaseAfterReap() bool
	// KeepTombstones: an ended request or stream refuses late Assigns for a
	// while (no-tombstones).
	KeepTombstones() bool
	// WaitForInDoubt: a batch whose send failed in doubt is settled only
	// by its quiesce (ack-after-failed-send).
	WaitForInDoubt() bool
	// SelfLease is a lease a rank gives itself on every heartbeat; zero:
	// a rank posts only under leases decode granted (self-renewed-lease).
	SelfLease() time.Duration
}

var (
	policiesMu sync.RWMutex
	policies   = map[string]func(Variant) Policy{}
)

// Register links variant v's policy into this binary: build makes the
// policy of one value of v (the self-renewed lease travels in the value).
// Only internal/unsafecore calls it, from its init.
func Register(v Variant, build func(Variant) Policy) {
	policiesMu.Lock()
	defer policiesMu.Unlock()
	policies[v.name] = build
}

// Policy is variant v's policy, or nil where this binary does not link
// it, and for Safe (the core uses its own).
func (v Variant) Policy() Policy {
	if v.IsSafe() {
		return nil
	}
	policiesMu.RLock()
	build := policies[v.name]
	policiesMu.RUnlock()
	if build == nil {
		return nil
	}
	return build(v)
}
