package sim

import (
	"github.com/kvfence/kvfence/core"
)

// arrive is a new request at the router. Room ids come from a small space,
// so they are reused; each reuse gets a new generation.
func (c *cluster) arrive() {
	c.arrivals++
	if c.noMore || c.stopped {
		return
	}
	room := c.rng.IntN(c.p.Rooms)
	c.roomGen[room]++
	c.nextUID++
	r := &simReq{uid: c.nextUID, key: core.RequestKey{Room: uint64(room), Gen: c.roomGen[room]}}
	r.pages = 1 + c.rng.IntN(c.p.MaxPages)
	r.total = r.pages
	if c.rng.Float64() < c.p.Truncate {
		r.total = c.rng.IntN(r.pages) // cut short on prefill: pages nobody writes
	}
	r.reject = c.rng.Float64() < c.p.RejectP
	r.slow = c.rng.Float64() < c.p.SlowPrefill
	if c.rng.Float64() < c.p.FanOutAll {
		r.decodes = append(r.decodes, c.decodes...)
	} else {
		r.decodes = append(r.decodes, c.decodes[c.rng.IntN(len(c.decodes))])
	}
	c.reqs[r.key] = r
	c.order = append(c.order, r)
	c.tracef("router: request %s uid=%d pages=%d total=%d reject=%v decodes=%d", r.key, r.uid, r.pages, r.total, r.reject, len(r.decodes))
	c.admit(r)
}

// admit asks every decode rank of the request for slots at once; with no
// room it retries later (a real router queues), and gives up after a while.
func (c *cluster) admit(r *simReq) {
	if c.stopped || r.done {
		return
	}
	if c.noMore {
		r.done = true
		return
	}
	for _, d := range r.decodes {
		if d.r.FreeSlots() < r.pages || !d.r.Admitting() {
			r.attempts++
			if r.attempts > maxAttempts {
				r.done = true
				return
			}
			c.sch.after(retryAdmit, func() { c.admit(r) })
			return
		}
	}
	ranks := make([]core.RankID, len(c.prefills))
	for i, p := range c.prefills {
		ranks[i] = p.id
	}
	for _, d := range r.decodes {
		tag, err := d.r.Admit(r.key, ranks, r.pages, c.dnow(d))
		if err != nil {
			c.violate("I6", "admit %s on decode %d failed although slots were free: %v", r.key, d.id, err)
			return
		}
		r.tags = append(r.tags, tag)
		d.tagReq[tag] = r
		d.admitted[tag] = c.sch.now
		c.tracef("decode %d: admit %s", d.id, tag)
		c.decodeOut(d)
	}
	for _, p := range c.prefills {
		p := p
		c.sch.after(5_000+c.rng.Int64N(150_000), func() { c.prefillOpen(p, r) })
	}
	if c.rng.Float64() < c.p.Abort {
		c.sch.after(c.rng.Int64N(2*lease), func() { c.abortRequest(r, "client") })
	}
}

func (c *cluster) prefillOpen(p *prefillNode, r *simReq) {
	if !p.alive || c.stopped {
		return
	}
	if r.aborted {
		// The router's abort got here first: abort before open.
		_ = p.s.Abort(r.key, c.pnow(p))
		c.prefillOut(p)
		return
	}
	if err := p.s.Open(r.key, r.pages, c.pnow(p)); err != nil {
		return
	}
	c.tracef("prefill %d: open %s", p.id, r.key)
	c.prefillOut(p)
	c.produce(p, r, 0)
}

// produce makes the request's pages one chunk at a time, then finishes (or
// rejects, or stops short).
func (c *cluster) produce(p *prefillNode, r *simReq, done int) {
	step := 20_000 + c.rng.Int64N(150_000)
	if r.slow {
		step = 300_000 + c.rng.Int64N(900_000)
	}
	c.sch.after(step, func() {
		if !p.alive || c.stopped || p.cancelled[r.key] {
			return
		}
		if r.reject && done == r.total/2 {
			c.tracef("prefill %d: reject %s", p.id, r.key)
			_ = p.s.Reject(r.key, c.pnow(p))
			c.prefillOut(p)
			return
		}
		if done < r.total {
			done++
			_ = p.s.Produce(r.key, done, c.pnow(p))
			c.prefillOut(p)
			c.produce(p, r, done)
			return
		}
		c.tracef("prefill %d: finish %s total=%d", p.id, r.key, r.total)
		_ = p.s.Finish(r.key, r.total, c.pnow(p))
		c.prefillOut(p)
	})
}

// abortRequest cancels prefill and decode of a request together (the
// router's cancel). Posted writes are not recalled by it: only the core's
// lifetime rules keep them out of other requests' memory.
func (c *cluster) abortRequest(r *simReq, why string) {
	if r.aborted || c.stopped {
		return
	}
	r.aborted = true
	c.tracef("router: abort %s (%s)", r.key, why)
	for i, d := range r.decodes {
		if i < len(r.tags) && r.tags[i].Instance == d.inst {
			if st, ok := d.r.State(r.tags[i]); ok && st == core.StateAssigned {
				_ = d.r.Abort(r.tags[i], core.ReasonClientAbort, c.dnow(d))
				c.decodeOut(d)
			}
		}
	}
	for _, p := range c.prefills {
		p := p
		// The router's cancel crosses the same network as everything else:
		// it can be lost, or cut by the rank's partition.
		if c.routerCut(p) || c.rng.Float64() < c.p.Loss {
			c.tracef("net: lost router abort %s to prefill %d", r.key, p.id)
			continue
		}
		c.sch.after(5_000+c.rng.Int64N(100_000), func() {
			if p.alive && !c.stopped {
				p.cancelled[r.key] = true
				_ = p.s.Abort(r.key, c.pnow(p))
				_ = p.s.Close(r.key, c.pnow(p))
				c.prefillOut(p)
			}
		})
	}
}

// storm aborts every live request at once (memory pressure, a client wave).
func (c *cluster) storm() {
	c.tracef("router: abort storm")
	for _, r := range c.order {
		if !r.done && !r.aborted {
			c.abortRequest(r, "storm")
		}
	}
}

// crash kills a prefill rank: it stops at once, but its posted writes keep
// landing until they are reaped (within the tail). Decode learns it later.
func (c *cluster) crash(p *prefillNode) {
	if !p.alive || c.stopped {
		return
	}
	c.tracef("prefill %d: CRASH", p.id)
	p.alive = false
	c.noMore = true // its TP group is broken: no new requests
	for _, r := range c.order {
		if !r.done {
			c.abortRequest(r, "rank crash")
		}
	}
	c.sch.after(deadAfter, func() {
		for _, d := range c.decodes {
			d.r.PeerDead(p.id, c.dnow(d))
			c.decodeOut(d)
		}
	})
}

// restart replaces a decode rank's process: a new instance, and its memory
// is either quarantined (safe) or reused at once (the restart-reuse bug).
func (c *cluster) restart(d *decodeNode) {
	if c.stopped {
		return
	}
	c.tracef("decode %d: RESTART (instance %d → %d)", d.id, d.inst, d.inst+1)
	c.countBlastRadius(d)
	for _, r := range c.order {
		for _, tag := range r.tags {
			if _, live := d.tagReq[tag]; live {
				delete(d.tagReq, tag) // the old instance's exposure is gone with it
				c.abortRequest(r, "decode restart")
				r.released++
				c.maybeDone(r)
			}
		}
	}
	quarantine := c.cfg.Variant.IsSafe() || c.cfg.Variant.Name() != "restart-reuse"
	for i := range d.slots {
		if quarantine {
			d.slots[i].state = slotQuarantine
		} else {
			d.slots[i].state = slotFree
		}
		d.slots[i].tag = core.Tag{}
	}
	c.startDecode(d, true)
}

func (c *cluster) maybeDone(r *simReq) {
	if !r.done && len(r.tags) > 0 && r.released >= len(r.tags) {
		r.done = true
	}
}
