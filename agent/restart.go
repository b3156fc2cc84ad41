package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// The restart fence (core/receiver_restart.go) for a transport that cannot
// revoke: decode runs Targets target plugin processes, each with the pool
// registered in it and its own data endpoint; an exposure's keys are those
// of the instance the core bound it to. When the core asks for an instance
// to be restarted, decode closes its process, waits for the reap (the
// evidence: no thread or registration of it can write any more), starts a
// new one, tells every prefill rank its endpoint, and only then reports
// TargetRestarted, which releases the instance's holds as fenced.

// MaxTargets bounds the target instances of one decode rank: a prefill rank
// opens lanes to each, so a decode that names more is refused there.
const MaxTargets = 64

// RestartConfig turns the restart fence on.
type RestartConfig struct {
	Targets int           // target plugin instances (each its own process)
	After   time.Duration // a hold lasting this long restarts its instance
	// Open starts one target plugin process; every instance is opened with
	// it (the same binary and options).
	Open func(ctx context.Context) (TargetProcess, error)
}

// TargetProcess is one target plugin process (*sdk.Plugin is one).
type TargetProcess interface {
	Transport() sdk.Transport
	// Close ends the process and returns once it has been reaped.
	Close() error
	// Exited is closed once the process has been reaped.
	Exited() <-chan struct{}
}

// target is one running instance: its process and what the pool is
// registered and exposed as in it.
type target struct {
	proc    TargetProcess
	tr      sdk.Transport
	region  sdk.RegionID
	poolKey sdk.Key
	data    sdk.Endpoint
	ending  bool // decode is ending it (loop-owned): its exit is no crash
}

// dataTarget is how a prefill rank reaches one target instance.
type dataTarget struct {
	Transport string `json:"transport"`
	Address   string `json:"address"`
	Opaque    []byte `json:"opaque,omitempty"`
}

func (d *Decode) restartFenced() bool { return d.cfg.Restart != nil && d.cfg.Restart.Targets > 0 }

// openTarget starts one instance and exposes the whole pool in it under one
// key: the instance's process is the fence, not its keys.
func (d *Decode) openTarget(ctx context.Context) (*target, error) {
	proc, err := d.cfg.Restart.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("decode: start target instance: %w", err)
	}
	t := &target{proc: proc, tr: proc.Transport()}
	fail := func(what string, err error) (*target, error) {
		_ = proc.Close()
		return nil, fmt.Errorf("decode: target instance: %s: %w", what, err)
	}
	g, ok := t.tr.(sdk.Granter)
	if !ok {
		return fail("grant", errdefs.Errorf(errdefs.FailedPrecondition, "the transport cannot grant keys"))
	}
	if t.region, err = t.tr.RegisterMemory(ctx, d.mem.Desc()); err != nil {
		return fail("register pool", err)
	}
	if t.poolKey, err = g.Grant(ctx, sdk.Window{Region: t.region, Length: uint64(int64(d.cfg.Slots) * d.slotB)}); err != nil {
		return fail("grant pool key", err)
	}
	if t.data, err = t.tr.LocalEndpoint(ctx); err != nil {
		return fail("endpoint", err)
	}
	return t, nil
}

// openTargets starts every instance (NewDecode, restart fence on).
func (d *Decode) openTargets(ctx context.Context) error {
	for range d.cfg.Restart.Targets {
		t, err := d.openTarget(ctx)
		if err != nil {
			d.closeTargets()
			return err
		}
		d.targets = append(d.targets, t)
	}
	return nil
}

// startRestartFenced maps the pool, opens every instance and starts the
// core with the restart fence (NewDecode).
func (d *Decode) startRestartFenced(ctx context.Context) error {
	var err error
	if d.mem, err = sdk.NewSharedMemory(fmt.Sprintf("decode-%d-pool", d.cfg.Rank), uint64(int64(d.cfg.Slots)*d.slotB)); err != nil {
		return err
	}
	if err := d.openTargets(ctx); err != nil {
		d.mem.Close()
		return err
	}
	first := d.targets[0]
	if d.info, err = first.tr.Info(ctx); err == nil {
		d.tr, d.region, d.poolKey, d.data = first.tr, first.region, first.poolKey, first.data
		err = d.newCore(core.RestartFenceConfig{Targets: d.cfg.Restart.Targets, After: d.cfg.Restart.After})
	}
	if err != nil {
		d.closeTargets()
		d.mem.Close()
		return err
	}
	d.hello.DataTargets = d.dataTargets()
	for i, t := range d.targets {
		d.watchTarget(i, t)
	}
	return nil
}

func (d *Decode) dataTargets() []dataTarget {
	out := make([]dataTarget, len(d.targets))
	for i, t := range d.targets {
		out[i] = dataTarget{Transport: t.data.Transport, Address: t.data.Address, Opaque: t.data.Opaque}
	}
	return out
}

func (d *Decode) closeTargets() {
	for _, t := range d.targets {
		t.ending = true
		_ = t.proc.Close()
	}
}

// grantTarget gives an exposure the pool key of the instance serving it.
func (d *Decode) grantTarget(dt *decTag) {
	i, _ := d.core.Target(dt.tag)
	t := d.targets[i]
	dt.keys = make([]keyRef, len(dt.slots))
	for j, s := range dt.slots {
		dt.keys[j] = keyRef{Key: uint64(t.poolKey), Base: uint64(int64(s) * d.slotB), Target: i}
	}
}

// restartTarget carries out a RestartTarget (loop only).
func (d *Decode) restartTarget(r core.RestartTarget) {
	if d.targets[r.Target].ending {
		return // it exited unasked and is being replaced: that reap answers this too
	}
	d.log.Warn("restarting target instance", "target", r.Target)
	d.replaceTarget(r.Target, true)
}

// watchTarget turns an instance's exit that decode did not ask for (a
// crash, a kill) into a restart: the reap is evidence all the same.
func (d *Decode) watchTarget(i int, t *target) {
	go func() {
		select {
		case <-t.proc.Exited():
		case <-d.lp.stop:
			return
		}
		d.lp.post(func() {
			if d.targets[i] == t && !t.ending {
				d.log.Error("target instance exited unasked; restarting it", "target", i)
				d.replaceTarget(i, false)
			}
		})
	}()
}

// replaceTarget ends instance i (loop only): its process is closed (when
// decode asks) and reaped off the loop, a new one started, and then, on the
// loop, prefill ranks learn its endpoint and the core learns of the reap.
func (d *Decode) replaceTarget(i int, close bool) {
	old := d.targets[i]
	old.ending = true
	r := core.RestartTarget{Target: i}
	d.revokes.Add(1)
	go func() {
		defer d.revokes.Done()
		if close {
			_ = old.proc.Close()
		}
		<-old.proc.Exited() // the evidence: nothing of it writes any more
		var fresh *target
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			t, err := d.openTarget(ctx)
			cancel()
			if err == nil {
				fresh = t
				break
			}
			d.log.Error("target instance did not start; retrying", "target", r.Target, "error", err)
			select {
			case <-d.lp.stop:
				return
			case <-time.After(time.Second):
			}
		}
		if !d.lp.call(func() {
			d.targets[r.Target] = fresh
			d.watchTarget(r.Target, fresh)
			d.stats.TargetRestarts++
			d.announceTargets()
			if err := d.core.TargetRestarted(r.Target, now()); err != nil {
				d.log.Error("target restart refused by the core", "target", r.Target, "error", err)
			}
			d.act()
		}) {
			_ = fresh.proc.Close()
		}
	}()
}

// currentHello is what decode answers a Hello with (any goroutine).
func (d *Decode) currentHello() peerHello {
	d.helloMu.Lock()
	defer d.helloMu.Unlock()
	return d.hello
}

// announceTargets records every instance's endpoint for the next Hello and
// tells every linked prefill rank (loop only).
func (d *Decode) announceTargets() {
	d.helloMu.Lock()
	d.hello.DataTargets = d.dataTargets()
	h := d.hello
	d.helloMu.Unlock()
	for _, l := range d.links {
		if !l.send(&frame{Type: frameTargets, Hello: &h}) {
			d.Metrics.failedSend("control")
		}
	}
}

// connectTargets opens lanes to every decode target instance whose endpoint
// is new (prefill loop only). Lanes to a restarted instance's predecessor
// are dropped: the process behind them is gone.
func (p *Prefill) connectTargets(targets []dataTarget) {
	if len(targets) > MaxTargets {
		p.Metrics.reject("oversized")
		p.log.Error("decode names too many target instances; not connecting", "targets", len(targets), "max", MaxTargets)
		return
	}
	for len(p.targetLanes) < len(targets) {
		p.targetLanes = append(p.targetLanes, nil)
		p.targetAddrs = append(p.targetAddrs, "")
	}
	for _, gone := range p.targetLanes[len(targets):] {
		p.dropLanes(gone) // instances decode no longer names
	}
	p.targetLanes, p.targetAddrs = p.targetLanes[:len(targets)], p.targetAddrs[:len(targets)]
	for i, t := range targets {
		if p.targetAddrs[i] == t.Address && len(p.targetLanes[i]) > 0 {
			continue
		}
		p.targetAddrs[i] = t.Address
		p.dropLanes(p.targetLanes[i]) // the replaced instance's process is gone
		p.targetLanes[i] = nil
		for range p.cfg.Lanes {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			id, err := p.tr.Connect(ctx, sdk.Endpoint{Transport: t.Transport, Address: t.Address, Opaque: t.Opaque})
			cancel()
			if err != nil {
				p.log.Error("connect data lane", "target", i, "error", err)
				continue
			}
			p.adoptLane(id)
			p.targetLanes[i] = append(p.targetLanes[i], id)
		}
	}
}

// lanesFor are the lanes that reach the instance a key names: with target
// instances, those of its instance; else every lane.
func (p *Prefill) lanesFor(keys []keyRef, page int) []sdk.PeerID {
	if len(p.targetLanes) == 0 {
		return p.lanes
	}
	if page < 0 || page >= len(keys) {
		return nil
	}
	k := keys[page]
	if k.Target < 0 || k.Target >= len(p.targetLanes) {
		return nil
	}
	return p.targetLanes[k.Target]
}

// onTargets takes decode's new target endpoints (a frameTargets).
func (p *Prefill) onTargets(l *link, h *peerHello) bool {
	if h == nil {
		p.Metrics.reject("malformed")
		return true
	}
	targets := h.DataTargets
	return l.toLoop(p.lp, func() {
		if p.link == l {
			p.decode.DataTargets = targets
			p.connectTargets(targets)
		}
	})
}
