package core

import (
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
)

// safePolicy is the core's answer at every decision a known-unsafe
// variant changes (knownunsafe.Policy): the real rules. It is the only
// policy this package holds; the unsafe ones are linked from
// internal/unsafecore by the simulation, the tests and -tags
// kvfenceunsafe agents only.
type safePolicy struct{}

func (safePolicy) QuarantineOnRestart() bool { return true }
func (safePolicy) CountDeclaredTails() bool  { return true }
func (safePolicy) CheckCoverage() bool       { return true }
func (safePolicy) AckPerRank() bool          { return true }
func (safePolicy) WaitOnLocalAbort() bool    { return true }
func (safePolicy) WaitOnRemoteFailure() bool { return true }
func (safePolicy) FenceBeforeRelease() bool  { return true }
func (safePolicy) BoundAbortsByTail() bool   { return true }
func (safePolicy) MatchGenerations() bool    { return true }
func (safePolicy) FreezeRankLease() bool     { return true }
func (safePolicy) ReleaseAfterReap() bool    { return true }
func (safePolicy) KeepTombstones() bool      { return true }
func (safePolicy) WaitForInDoubt() bool      { return true }
func (safePolicy) SelfLease() time.Duration  { return 0 }

// policy is knownunsafe.Policy under the name the core's types use.
type policy = knownunsafe.Policy

var _ policy = safePolicy{}

// policyFor is the policy a configuration's variant selects: the safe one
// for Safe; a variant this binary does not link is refused rather than run
// as the safe core under an unsafe name.
func policyFor(v knownunsafe.Variant) (policy, error) {
	if v.IsSafe() {
		return safePolicy{}, nil
	}
	if p := v.Policy(); p != nil {
		return p, nil
	}
	return nil, errorf(errdefs.FailedPrecondition, "core variant %s is not linked into this binary (only the simulation, the tests and -tags kvfenceunsafe agents link internal/unsafecore)", v.Name())
}
