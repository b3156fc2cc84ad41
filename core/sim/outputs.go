package sim

import (
	"github.com/kvfence/kvfence/core"
)

// holdBound is the longest any hold may last (I6): the latest lease decode
// can grant, the longest writer's tail and margin, once more for a fence that
// never answers, and tick granularity.
const holdBound = maxHold + 2*(maxRankTail+maxSkew) + 2*tickEvery

func (c *cluster) decodeOut(d *decodeNode) {
	out := d.r.Ready()
	for _, env := range out.Messages {
		m := env.Msg
		if m.Kind == core.KindAssign {
			c.expose(d, m.Tag, m.Slots)
			c.bindTarget(d, m.Tag)
		}
		if p := c.prefillByID(env.To); p != nil {
			c.tracef("decode %d -> prefill %d: %s", d.id, p.id, m)
			c.deliver(d, p, false, m)
		}
	}
	for _, rv := range out.Revokes {
		c.revoke(d, rv)
	}
	for _, rt := range out.Restarts {
		c.restartTarget(d, rt)
	}
	for _, h := range out.Handoffs {
		c.handoff(d, h)
	}
	var failed []*simReq
	for _, f := range out.Failures {
		d.stopped[f.Tag] = true
		c.tracef("decode %d: %s failed (%s), held", d.id, f.Tag, f.Reason)
		if r := d.tagReq[f.Tag]; r != nil {
			failed = append(failed, r)
		}
	}
	for _, rel := range out.Releases {
		c.release(d, rel)
	}
	for _, r := range failed {
		c.abortRequest(r, "decode failure")
	}
}

func (c *cluster) expose(d *decodeNode, tag core.Tag, slots []uint32) {
	d.exposed[tag] = append([]uint32(nil), slots...)
	for _, s := range slots {
		sh := &d.slots[s]
		if sh.state == slotExposed && sh.tag == tag {
			continue // the same Assign to another rank
		}
		if sh.state != slotFree {
			c.violate("I1", "decode %d exposed slot %d to %s while it is %s", d.id, s, tag, describe(sh))
			return
		}
		sh.state, sh.tag = slotExposed, tag
	}
}

// handoff checks I2: every page holds this request's bytes, and the request
// was never stopped.
func (c *cluster) handoff(d *decodeNode, h core.Handoff) {
	r := d.tagReq[h.Tag]
	if d.stopped[h.Tag] {
		c.violate("I2", "decode %d handed off %s after it was aborted or rejected", d.id, h.Tag)
		return
	}
	for i, s := range h.Slots {
		sh := &d.slots[s]
		if sh.state != slotExposed || sh.tag != h.Tag {
			c.violate("I2", "decode %d handed off %s with slot %d %s", d.id, h.Tag, s, describe(sh))
			return
		}
		if r == nil {
			c.violate("I2", "decode %d handed off %s, which the router never admitted there", d.id, h.Tag)
			return
		}
		if sh.content != r.uid {
			c.violate("I2", "decode %d handed off %s but page %d (slot %d) holds bytes of request uid %d, not %d",
				d.id, h.Tag, i, s, sh.content, r.uid)
			return
		}
		sh.state = slotHanded
	}
	c.res.Handoffs++
	c.tracef("decode %d: HANDOFF %s", d.id, h.Tag)
	inst := d.inst
	tag := h.Tag
	c.sch.after(50_000+c.rng.Int64N(700_000), func() {
		if c.stopped || d.inst != inst {
			return
		}
		if err := d.r.Finish(tag, c.dnow(d)); err != nil {
			c.violate("I6", "finish of handed-off %s refused: %v", tag, err)
			return
		}
		c.decodeOut(d)
	})
}

func (c *cluster) release(d *decodeNode, rel core.Release) {
	c.res.Released[rel.Path]++
	if int64(rel.Held) > c.res.MaxHoldNs {
		c.res.MaxHoldNs = int64(rel.Held)
	}
	if int64(rel.Held) > holdBound {
		c.violate("I6", "decode %d held %s for %v, beyond the bound %v", d.id, rel.Tag, rel.Held, tdur(holdBound))
	}
	if rel.Tag == (core.Tag{}) { // the restart quarantine
		for _, s := range rel.Slots {
			if d.slots[s].state == slotQuarantine {
				d.slots[s].state = slotFree
			}
		}
		c.tracef("decode %d: quarantine released (%s)", d.id, rel.Path)
		return
	}
	for _, s := range rel.Slots {
		sh := &d.slots[s]
		if (sh.state != slotExposed && sh.state != slotHanded) || sh.tag != rel.Tag {
			c.violate("I3", "decode %d released slot %d for %s while it is %s", d.id, s, rel.Tag, describe(sh))
			return
		}
		sh.state, sh.tag = slotFree, core.Tag{}
	}
	c.tracef("decode %d: release %s by %s after %v", d.id, rel.Tag, rel.Path, rel.Held)
	if r := d.tagReq[rel.Tag]; r != nil {
		delete(d.tagReq, rel.Tag)
		r.released++
		c.maybeDone(r)
	}
}

func (c *cluster) prefillOut(p *prefillNode) {
	out := p.s.Ready()
	var closes []core.RequestKey
	for _, env := range out.Messages {
		m := env.Msg
		if m.Kind == core.KindDrainAck || m.Kind == core.KindCommit {
			// I5: a rank may only say its writes stopped when none can move.
			if n := c.pending[streamRef{p.idx, m.Tag, m.Decode}]; n > 0 {
				c.violate("I5", "prefill %d sent %s while %d of its writes for it can still land", p.id, m, n)
				return
			}
		}
		if m.Kind == core.KindDrainAck && p.idx == c.p.Liar {
			c.lie(p, m)
		}
		if d := c.decodeByID(env.To); d != nil {
			c.tracef("prefill %d -> decode %d: %s", p.id, d.id, m)
			c.deliver(d, p, true, m)
		}
	}
	for _, post := range out.Posts {
		c.post(p, post)
	}
	for _, q := range out.Quiesces {
		c.quiesce(p, q)
	}
	for _, sr := range out.SourceReleases {
		p.srcReleased[sr.Key] = true
		c.tracef("prefill %d: source pages of %s released", p.id, sr.Key)
	}
	for _, f := range out.Failures {
		// The engine sees the request failed (poll → Failed) and drops it;
		// the core keeps whatever must stay held.
		closes = append(closes, f.Tag.Key())
	}
	for _, s := range out.Sent {
		p.sent[s.Key]++
		if r := c.reqs[s.Key]; r != nil && p.sent[s.Key] >= len(r.decodes) {
			closes = append(closes, s.Key)
		}
	}
	for _, k := range closes {
		if p.s.Close(k, c.pnow(p)) == nil {
			c.prefillOut(p)
		}
	}
}
