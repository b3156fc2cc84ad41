package sim

import (
	"math/rand/v2"
	"time"

	"github.com/kvfence/kvfence/core"
)

// The restart fence in the simulation: decode's transport cannot revoke,
// and each decode rank runs several target plugin instances. A write lands
// only while the instance that served its tag at Assign is the same process
// (its epoch): once that process is reaped (the restart), the write has no
// socket or registration to land through and is dropped. A write still
// lands between the restart request and the reap: releasing before the
// reap (the release-before-reap variant) lets it land in reused memory.

// unboundedDecl is what a non-revoking plugin declares for "no bound"
// (plugins/kit/nocancel): about fifty years.
const unboundedDecl = int64(50 * 365 * 24 * time.Hour)

// unboundedSpread is how late the simulated unbounded writer's bytes really
// land: far past every time bound decode could use, within the run.
const unboundedSpread = 8 * lease

// drawRestart draws the restart-fence part of a profile from a stream of
// its own, so that it leaves every other draw of a seed unchanged: a seed
// reported before the fence was simulated still replays the same run.
func (p *Profile) drawRestart(seed uint64) {
	p.Unbounded = -1
	rng := rand.New(rand.NewPCG(seed, 0x7265737461727421))
	if p.CanRevoke || rng.IntN(2) == 0 {
		return
	}
	p.Targets = 1 + rng.IntN(3)
	p.RestartAfter = int64(pick(rng, 0.5, 1, 2) * float64(lease))
	p.ReapDelay = int64(pick(rng, 0.05, 0.2, 0.5) * float64(lease))
	if rng.IntN(2) == 0 {
		p.Unbounded = rng.IntN(p.Prefill)
		p.Tails[p.Unbounded] = unboundedSpread
		// A restarted decode keeps its quarantine for the longest declared
		// tail, which is unbounded here: not simulated (docs: restart fence).
		p.RestartDecode = false
	}
}

// drawRefusals draws which prefill ranks do not isolate refused writes
// (Unisolated), from a stream of its own: the other draws of a seed stay
// what they were.
func (p *Profile) drawRefusals(seed uint64) {
	if !p.EagerRevoke {
		return
	}
	rng := rand.New(rand.NewPCG(seed, 0x69736f6c61746521))
	p.Unisolated = make([]bool, p.Prefill)
	for i := range p.Unisolated {
		p.Unisolated[i] = rng.IntN(3) == 0
	}
}

// isolated says whether prefill rank i declares isolated refusals.
func (p *Profile) isolated(i int) bool { return i >= len(p.Unisolated) || !p.Unisolated[i] }

// declaredTail is the tail prefill rank i declares to decode.
func (p *Profile) declaredTail(i int) int64 {
	if i == p.Unbounded {
		return unboundedDecl
	}
	return p.Tails[i]
}

func (p *Profile) restartFence() core.RestartFenceConfig {
	return core.RestartFenceConfig{Targets: p.Targets, After: tdur(p.RestartAfter)}
}

// bindTarget records which instance (and which process of it) serves a
// newly assigned tag: its writers hold that process's address and keys.
func (c *cluster) bindTarget(d *decodeNode, tag core.Tag) {
	if c.p.Targets == 0 {
		return
	}
	if _, ok := d.tagTarget[tag]; ok {
		return
	}
	t, _ := d.r.Target(tag)
	d.tagTarget[tag] = targetRef{t, d.epochs[t]}
}

// throughTarget says whether a write for tag can still land: the process it
// was bound to is alive.
func (c *cluster) throughTarget(d *decodeNode, tag core.Tag) bool {
	ref, ok := d.tagTarget[tag]
	return !ok || d.epochs[ref.target] == ref.epoch
}

// restartTarget kills and reaps one target instance after ReapDelay, then
// tells decode (TargetRestarted).
func (c *cluster) restartTarget(d *decodeNode, rt core.RestartTarget) {
	c.res.TargetRestarts++
	inst := d.inst
	c.tracef("decode %d: restart of target instance %d asked for", d.id, rt.Target)
	c.sch.after(c.p.ReapDelay/2+c.rng.Int64N(c.p.ReapDelay/2+1), func() {
		if c.stopped || d.inst != inst {
			return
		}
		d.epochs[rt.Target]++
		c.tracef("decode %d: target instance %d reaped (epoch %d)", d.id, rt.Target, d.epochs[rt.Target])
		if err := d.r.TargetRestarted(rt.Target, c.dnow(d)); err != nil {
			c.violate("I6", "TargetRestarted(%d) refused: %v", rt.Target, err)
			return
		}
		c.decodeOut(d)
	})
}

type targetRef struct {
	target int
	epoch  uint64
}

// countBlastRadius adds the live exposures that decode instance d's target
// restarts failed (called once per decode instance, when it ends).
func (c *cluster) countBlastRadius(d *decodeNode) {
	c.res.RestartFailed += int(d.r.Metrics().RestartFailed)
}
