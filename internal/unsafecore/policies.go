package unsafecore

import (
	"time"

	ku "github.com/kvfence/kvfence/core/knownunsafe"
)

// rules gives the safe answer to every decision; each variant below embeds
// it and breaks one rule. TestEachVariantBreaksOneRule (core) checks that
// these answers are the core's own.
type rules struct{}

func (rules) QuarantineOnRestart() bool { return true }
func (rules) CountDeclaredTails() bool  { return true }
func (rules) CheckCoverage() bool       { return true }
func (rules) AckPerRank() bool          { return true }
func (rules) WaitOnLocalAbort() bool    { return true }
func (rules) WaitOnRemoteFailure() bool { return true }
func (rules) FenceBeforeRelease() bool  { return true }
func (rules) BoundAbortsByTail() bool   { return true }
func (rules) MatchGenerations() bool    { return true }
func (rules) FreezeRankLease() bool     { return true }
func (rules) ReleaseAfterReap() bool    { return true }
func (rules) KeepTombstones() bool      { return true }
func (rules) WaitForInDoubt() bool      { return true }
func (rules) SelfLease() time.Duration  { return 0 }

// releaseOnAbort: ranks are told of a local abort, but nobody waits for
// them before the memory goes back.
type releaseOnAbort struct{ rules }

func (releaseOnAbort) WaitOnLocalAbort() bool { return false }

// releaseOnRemoteFailure: the same for a failed send, a dead peer or a
// rejection.
type releaseOnRemoteFailure struct{ rules }

func (releaseOnRemoteFailure) WaitOnRemoteFailure() bool { return false }

// ackAfterFailedSend takes a send error as "it stopped".
type ackAfterFailedSend struct{ rules }

func (ackAfterFailedSend) WaitForInDoubt() bool { return false }

// ignoreGenerations matches messages on the room alone, newest first: what
// a system without generation tags does.
type ignoreGenerations struct{ rules }

func (ignoreGenerations) MatchGenerations() bool { return false }

// unboundedTimeout ends an aborting hold after "a short fixed timeout".
type unboundedTimeout struct{ rules }

func (unboundedTimeout) BoundAbortsByTail() bool { return false }

// singleAckTarget takes one rank's ack for every rank's.
type singleAckTarget struct{ rules }

func (singleAckTarget) AckPerRank() bool { return false }

// noCoverageCheck hands off a request whose commit covered fewer pages.
type noCoverageCheck struct{ rules }

func (noCoverageCheck) CheckCoverage() bool { return false }

// selfRenewedLease: a rank gives itself a lease nobody granted.
type selfRenewedLease struct {
	rules
	lease time.Duration
}

func (p selfRenewedLease) SelfLease() time.Duration { return p.lease }

// noTombstones forgets ended requests and streams at once.
type noTombstones struct{ rules }

func (noTombstones) KeepTombstones() bool { return false }

// restartReuse trusts a restarted receiver's memory at once.
type restartReuse struct{ rules }

func (restartReuse) QuarantineOnRestart() bool { return false }

// ownTailOnly bounds writes by the receiver's own transport tail only.
type ownTailOnly struct{ rules }

func (ownTailOnly) CountDeclaredTails() bool { return false }

// releaseOnDrainAck trusts the ranks' acks with a fence at hand.
type releaseOnDrainAck struct{ rules }

func (releaseOnDrainAck) FenceBeforeRelease() bool { return false }

// releaseBeforeReap releases a restarted target's holds when the restart
// is asked for, while the old process can still apply writes.
type releaseBeforeReap struct{ rules }

func (releaseBeforeReap) ReleaseAfterReap() bool { return false }

// rankLeaseForgotten: the bound of a tag decode stops covering forgets the
// rank lease the rank posted under.
type rankLeaseForgotten struct{ rules }

func (rankLeaseForgotten) FreezeRankLease() bool { return false }

func fixed(p ku.Policy) func(ku.Variant) ku.Policy { return func(ku.Variant) ku.Policy { return p } }

func init() {
	ku.Register(ku.ReleaseOnAbort, fixed(releaseOnAbort{}))
	ku.Register(ku.ReleaseOnRemoteFailure, fixed(releaseOnRemoteFailure{}))
	ku.Register(ku.AckAfterFailedSend, fixed(ackAfterFailedSend{}))
	ku.Register(ku.IgnoreGenerations, fixed(ignoreGenerations{}))
	ku.Register(ku.UnboundedTimeout, fixed(unboundedTimeout{}))
	ku.Register(ku.SingleAckTarget, fixed(singleAckTarget{}))
	ku.Register(ku.NoCoverageCheck, fixed(noCoverageCheck{}))
	ku.Register(ku.SelfRenewedLease, func(v ku.Variant) ku.Policy { return selfRenewedLease{lease: v.SelfLease()} })
	ku.Register(ku.NoTombstones, fixed(noTombstones{}))
	ku.Register(ku.RestartReuse, fixed(restartReuse{}))
	ku.Register(ku.OwnTailOnly, fixed(ownTailOnly{}))
	ku.Register(ku.ReleaseOnDrainAck, fixed(releaseOnDrainAck{}))
	ku.Register(ku.ReleaseBeforeReap, fixed(releaseBeforeReap{}))
	ku.Register(ku.RankLeaseForgotten, fixed(rankLeaseForgotten{}))
}

// Linked reports whether every known-unsafe variant has its policy here:
// a caller that imports the package for its registrations calls it so the
// import reads as what it is for.
func Linked() bool {
	for _, v := range ku.All {
		if v.Policy() == nil {
			return false
		}
	}
	return true
}
