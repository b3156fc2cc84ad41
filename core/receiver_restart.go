package core

import (
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// The restart fence: for a transport that cannot revoke (Mooncake, NIXL,
// MORI), decode can still stop bytes landing by ending the target-side
// plugin process that applies them. Once that process is reaped, neither
// its threads nor its registrations can write (a socket it read is closed, a
// memory region it registered is gone with it). The evidence holds only
// where every byte passes through the target process or its registrations:
// never for a transport in which the initiator writes the target's memory
// directly on the same host (UCX shared memory: CMA, XPMEM, mapped
// segments), which the plugins refuse.
//
// Decode runs RestartFence.Targets target instances; each exposure is served
// by one (Target). A hold that must end sooner than its bound — a dead writer,
// a hold past RestartFence.After, a writer whose tail is unbounded — makes
// the core ask for its instance to be restarted (Output.Restarts). From then
// on no exposure is admitted on that instance, and the exposures still
// live on it fail and are held like any abort (the blast radius). The caller
// kills the process, reaps it, starts a new one and reports TargetRestarted:
// only then are the holds it served released, as fenced.

// RestartFenceConfig turns the restart fence on (Targets > 0).
type RestartFenceConfig struct {
	// Targets is how many target plugin instances serve this decode rank;
	// more instances make one restart fail fewer live exposures. Zero: no
	// restart fence.
	Targets int
	// After is how long a hold may last before its instance is restarted
	// (when its time bound is later than that). Must be positive.
	After time.Duration
}

// RestartTarget asks the caller to end target plugin instance Target (kill
// and reap its process), start a new one and report TargetRestarted. No
// exposure on it may be released before the reap.
type RestartTarget struct {
	Target int
}

type targetState struct {
	restarting bool
	live       int // exposures (any state) on this instance
}

func (c *RestartFenceConfig) validate() error {
	switch {
	case c.Targets < 0:
		return errorf(errdefs.InvalidArgument, "RestartFence.Targets must not be negative, got %d", c.Targets)
	case c.Targets > 0 && c.After <= 0:
		return errorf(errdefs.InvalidArgument, "RestartFence.After must be positive with %d targets, got %v", c.Targets, c.After)
	}
	return nil
}

// restartFenced says whether holds can end by restarting a target instance.
func (r *Receiver) restartFenced() bool { return r.cfg.RestartFence.Targets > 0 }

// Target reports which target instance serves a tag's exposure (always 0
// without a restart fence), or false if the tag has none.
func (r *Receiver) Target(tag Tag) (int, bool) {
	e := r.lookup(tag)
	if e == nil {
		return 0, false
	}
	return e.target, true
}

// pickTarget chooses the instance for a new exposure: the least loaded one
// that is not being restarted. It reports false when every one is.
func (r *Receiver) pickTarget() (int, bool) {
	if !r.restartFenced() {
		return 0, true
	}
	if r.targets == nil {
		r.targets = make([]targetState, r.cfg.RestartFence.Targets)
	}
	best := -1
	for i := range r.targets {
		if !r.targets[i].restarting && (best < 0 || r.targets[i].live < r.targets[best].live) {
			best = i
		}
	}
	return best, best >= 0
}

func (r *Receiver) attachTarget(e *exposure, target int) {
	e.target = target
	if r.targets != nil {
		r.targets[target].live++
	}
}

func (r *Receiver) detachTarget(e *exposure) {
	if r.targets != nil {
		r.targets[e.target].live--
	}
}

// tickRestart asks for a restart of every instance that serves a hold which
// must end sooner than its time bound allows.
func (r *Receiver) tickRestart(now Time) {
	if !r.restartFenced() {
		return
	}
	var due []int
	for _, e := range r.list {
		if e.state != StateAborting || r.targets[e.target].restarting {
			continue
		}
		bound, _ := r.writeBound(e, true)
		if bound <= now {
			continue // the timeout releases it now
		}
		deadline := e.stopped.Add(r.cfg.RestartFence.After)
		// With a revoking transport a dead writer is fenced by Revoke; the
		// restart is only the backstop for a hold past After.
		dead := !r.cfg.CanRevoke && r.hasDeadWriter(e)
		if dead || (now >= deadline && bound > deadline) {
			r.targets[e.target].restarting = true // once per instance
			due = append(due, e.target)
		}
	}
	for _, target := range due {
		r.requestRestart(target, now)
	}
}

func (r *Receiver) hasDeadWriter(e *exposure) bool {
	for i := range e.ranks {
		if t := &e.ranks[i]; !t.acked && t.dead {
			return true
		}
	}
	return false
}

// requestRestart asks for instance target to be restarted and fails the
// exposures still live on it: they can no longer be written to completion.
func (r *Receiver) requestRestart(target int, now Time) {
	r.metrics.TargetRestarts++
	r.out.Restarts = append(r.out.Restarts, RestartTarget{Target: target})
	r.failLiveOn(target, now)
	if !r.policy.ReleaseAfterReap() {
		r.releaseOn(target, PathUnsafe, now)
	}
}

// failLiveOn aborts every assigned exposure on target (the blast radius).
func (r *Receiver) failLiveOn(target int, now Time) {
	for i := 0; i < len(r.list); i++ {
		e := r.list[i]
		if e.target != target || e.state != StateAssigned {
			continue
		}
		r.metrics.RestartFailed++
		if r.startAbort(e, ReasonDecodeAbort, false, now) {
			i--
		}
	}
}

// releaseOn releases every aborting exposure on target by path.
func (r *Receiver) releaseOn(target int, path ReleasePath, now Time) {
	for i := 0; i < len(r.list); i++ {
		if e := r.list[i]; e.target == target && e.state == StateAborting {
			r.release(e, path, now)
			i--
		}
	}
}

// TargetRestarted reports that target instance target's process was reaped
// (asked for by RestartTarget, or a crash the caller observed) and a new one
// serves it: no write through the old process or its registrations can land
// any more. Every hold it served is released as fenced; exposures still
// live on it fail first (their writers' keys died with it). Handed-off
// exposures keep their memory: a restart counts as their revocation.
func (r *Receiver) TargetRestarted(target int, now Time) error {
	r.out.reset()
	if !r.restartFenced() || target < 0 || target >= r.cfg.RestartFence.Targets {
		return errorf(errdefs.InvalidArgument, "no target instance %d (this receiver has %d)", target, r.cfg.RestartFence.Targets)
	}
	if r.targets == nil {
		r.targets = make([]targetState, r.cfg.RestartFence.Targets)
	}
	r.failLiveOn(target, now)
	r.releaseOn(target, PathFenced, now)
	for i := 0; i < len(r.list); i++ {
		if e := r.list[i]; e.target == target && e.state == StateHanded {
			e.revoked = true
			if e.finished {
				r.release(e, PathCompleted, now)
				i--
			}
		}
	}
	r.targets[target].restarting = false
	return nil
}

// Admitting reports whether some target instance takes new exposures (false
// only while every one is being restarted: Admit would refuse).
func (r *Receiver) Admitting() bool {
	_, ok := r.pickTarget()
	return ok
}
