package sim

import (
	"github.com/kvfence/kvfence/core"
)

// post models one batch on a backend like Mooncake, NIXL or MORI: writes
// land within the sending rank's transport tail, but the completion may lie
// about when they stop. Every landing is scheduled now, so the model knows exactly
// when a batch can no longer move (that is what honest Quiesce reports).
func (c *cluster) post(p *prefillNode, post core.Post) {
	r := c.reqs[post.Tag.Key()]
	d := c.decodeByID(post.Decode)
	f := &flight{rank: p, batch: post.Batch, tag: post.Tag, dec: d, key: post.Tag.Key(), uid: r.uid}
	c.flights[flightKey{p.idx, post.Batch}] = f
	now := c.sch.now
	tail := c.p.Tails[p.idx]
	landAt := func(slot uint32) int64 {
		t := now + 2_000 + c.rng.Int64N(tail*4/5)
		c.landing(f, slot, t)
		return t
	}
	u := c.rng.Float64()
	var status core.BatchStatus
	var doneAt int64
	switch {
	case u < c.p.Definite:
		// Part of the batch lands, the rest provably never will.
		cut := c.rng.IntN(len(post.Slots))
		last := now
		for _, s := range post.Slots[:cut] {
			if t := landAt(s); t > last {
				last = t
			}
		}
		status, doneAt = core.FailedDefinite, last+1_000
	case u < c.p.Definite+c.p.Timeout:
		// A "timeout": reported in doubt early, the writes go on.
		for _, s := range post.Slots {
			landAt(s)
		}
		status, doneAt = core.InDoubt, now+1_000+c.rng.Int64N(tail/3)
	case u < c.p.Definite+c.p.Timeout+c.p.Resend:
		// An error after the bytes landed, and a resent slice lands again
		// after the error was reported.
		last := now
		for _, s := range post.Slots {
			if t := landAt(s); t > last {
				last = t
			}
		}
		status, doneAt = core.InDoubt, last+1_000
		resend := post.Slots[c.rng.IntN(len(post.Slots))]
		if room := now + tail - doneAt; room > 0 {
			c.landing(f, resend, doneAt+c.rng.Int64N(room))
		}
	default:
		last := now
		for _, s := range post.Slots {
			if t := landAt(s); t > last {
				last = t
			}
		}
		status, doneAt = core.Succeeded, last+1_000+c.rng.Int64N(20_000)
	}
	c.tracef("transport: post %s batch %d from prefill %d to decode %d slots %v (%s at +%dus)", post.Tag, post.Batch, p.id, d.id, post.Slots, status, (doneAt-now)/1000)
	c.sch.at(doneAt, func() {
		f.done = true
		if p.alive && !c.stopped {
			c.tracef("prefill %d: batch %d %s", p.id, f.batch, status)
			if err := p.s.Completed(f.batch, status, c.pnow(p)); err != nil {
				c.violate("I5", "completion of batch %d refused: %v", f.batch, err)
				return
			}
			c.prefillOut(p)
		}
		c.retire(f)
	})
}

func (c *cluster) landing(f *flight, slot uint32, at int64) {
	f.pending++
	if at > f.lastAt {
		f.lastAt = at
	}
	ref := streamRef{f.rank.idx, f.tag, f.dec.id}
	c.pending[ref]++
	c.sch.at(at, func() {
		f.pending--
		if c.pending[ref]--; c.pending[ref] == 0 {
			delete(c.pending, ref)
		}
		c.land(f, slot)
		c.retire(f)
	})
}

func (c *cluster) retire(f *flight) {
	if f.pending == 0 && (f.done || !f.rank.alive) {
		delete(c.flights, flightKey{f.rank.idx, f.batch})
	}
}

// land is where the bytes arrive: the heart of the checker (I1, I7).
func (c *cluster) land(f *flight, slot uint32) {
	if c.stopped {
		return
	}
	d := f.dec
	if d.revoked[f.tag] || f.tag.Instance < d.revBelow || !c.throughTarget(d, f.tag) {
		c.res.FencedWrites++
		c.tracef("decode %d: write of %s to slot %d dropped by fence", d.id, f.tag, slot)
		return
	}
	s := &d.slots[slot]
	switch {
	case s.state == slotExposed && s.tag == f.tag:
		if d.stopped[f.tag] {
			c.res.LateWrites++
		}
	case s.state == slotQuarantine && f.tag.Instance < d.inst:
		c.res.LateWrites++
	default:
		c.violate("I1", "write of %s (request uid %d) landed in decode %d slot %d, which is %s",
			f.tag, f.uid, d.id, slot, describe(s))
		return
	}
	if f.rogue {
		c.res.RogueWrites++
	} else if f.rank.srcReleased[f.key] {
		c.violate("I7", "write of %s read prefill %d source pages after they were released", f.tag, f.rank.id)
		return
	}
	c.tracef("decode %d: write of %s landed in slot %d", d.id, f.tag, slot)
	s.content = f.uid
}

func describe(s *slotShadow) string {
	switch s.state {
	case slotFree:
		return "free"
	case slotExposed:
		return "exposed to " + s.tag.String()
	case slotHanded:
		return "handed off to decode as " + s.tag.String()
	case slotQuarantine:
		return "quarantined"
	}
	return "?"
}

// lie makes the lying rank keep writing after its honest core sent a
// DrainAck: one to three writes to the tag's slots, within LieFor. They are
// not the core's (no I5 or I7 check), but wherever they land I1 is checked.
func (c *cluster) lie(p *prefillNode, m core.Message) {
	if m.Evidence != core.EvidenceCompleted && m.Evidence != core.EvidenceQuiesced {
		return // it never posted for the tag, so it does not know where to write
	}
	d := c.decodeByID(m.Decode)
	slots := d.exposed[m.Tag]
	r := c.reqs[m.Tag.Key()]
	if len(slots) == 0 || r == nil {
		return
	}
	f := &flight{rank: p, tag: m.Tag, dec: d, key: m.Tag.Key(), uid: r.uid, rogue: true}
	for n := 1 + c.rng.IntN(3); n > 0; n-- {
		slot := slots[c.rng.IntN(len(slots))]
		at := c.sch.now + 1_000 + c.rng.Int64N(c.p.LieFor)
		c.rogue++
		c.tracef("prefill %d: LIES: acked %s and will still write slot %d at %dus", p.id, m.Tag, slot, at/1000)
		c.sch.at(at, func() {
			c.rogue--
			c.land(f, slot)
		})
	}
}

// quiesce answers honestly: only once none of the batches can move.
func (c *cluster) quiesce(p *prefillNode, q core.Quiesce) {
	at := c.sch.now
	for _, id := range q.Batches {
		if f := c.flights[flightKey{p.idx, id}]; f != nil && f.pending > 0 && f.lastAt > at {
			at = f.lastAt
		}
	}
	ids := append([]core.BatchID(nil), q.Batches...)
	c.sch.at(at+1_000, func() {
		if p.alive && !c.stopped {
			c.tracef("prefill %d: quiesced %v", p.id, ids)
			p.s.Quiesced(ids, core.EvidenceQuiesced, c.pnow(p))
			c.prefillOut(p)
		}
	})
}

// revoke models receiver-side fencing (MR deregistration, MW invalidation):
// after a short delay no write under the tag can land.
func (c *cluster) revoke(d *decodeNode, rv core.Revoke) {
	inst := d.inst
	c.sch.after(10_000+c.rng.Int64N(70_000), func() {
		if c.stopped || d.inst != inst {
			return
		}
		if rv.All {
			d.revBelow = inst
			c.tracef("decode %d: every key of instances < %d revoked", d.id, inst)
			d.r.RevokedAll(c.dnow(d))
		} else {
			d.revoked[rv.Tag] = true
			c.tracef("decode %d: keys of %s revoked", d.id, rv.Tag)
			d.r.Revoked(rv.Tag, c.dnow(d))
		}
		c.decodeOut(d)
	})
}
