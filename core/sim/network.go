package sim

import (
	"github.com/kvfence/kvfence/core"
)

// copyMsg deep-copies a message: the core's output slices are only valid
// until its next input, and the network keeps messages for later.
func copyMsg(m core.Message) core.Message {
	m.Ranks = append([]core.RankID(nil), m.Ranks...)
	m.Slots = append([]uint32(nil), m.Slots...)
	m.Tags = append([]core.Tag(nil), m.Tags...)
	m.Ended = append([]core.Tag(nil), m.Ended...)
	return m
}

func (c *cluster) partitioned(d *decodeNode, p *prefillNode) bool {
	return c.p.Partition && d.idx == c.partA && p.idx == c.partB && c.sch.now >= c.partFrom && c.sch.now < c.partTo
}

// deliver carries a control message over the adversarial network: it may be
// lost, delayed (reordered), duplicated long after, or cut by a partition.
func (c *cluster) deliver(d *decodeNode, p *prefillNode, toDecode bool, m core.Message) {
	if c.partitioned(d, p) || c.rng.Float64() < c.p.Loss {
		c.tracef("net: lost %s", m)
		return
	}
	m = copyMsg(m)
	copies := 1
	if c.rng.Float64() < c.p.Dup {
		copies = 2
	}
	for i := 0; i < copies; i++ {
		delay := 5_000 + c.rng.Int64N(100_000)
		if i == 1 {
			delay += c.rng.Int64N(2 * lease) // a duplicate, much later
		} else if c.rng.Float64() < c.p.Slow {
			delay += c.rng.Int64N(lease + lease/2)
		}
		c.sch.after(delay, func() {
			if c.stopped {
				return
			}
			if toDecode {
				c.tracef("decode %d <- %s", d.id, m)
				_, live := d.tagReq[m.Tag]
				stale := m.Kind != core.KindHeartbeat && (m.Tag.Instance != d.inst || !live)
				d.r.Step(m, c.dnow(d))
				if out := d.r.Ready(); stale && len(out.Handoffs)+len(out.Releases)+len(out.Failures)+len(out.Revokes)+len(out.Messages) > 0 {
					c.violate("I4", "decode %d changed state on a stale message %s", d.id, m)
				}
				c.decodeOut(d)
			} else if p.alive {
				c.tracef("prefill %d <- %s", p.id, m)
				p.s.Step(m, c.pnow(p))
				c.prefillOut(p)
			}
		})
	}
}

// routerCut: a partitioned prefill rank is cut off from the router too.
func (c *cluster) routerCut(p *prefillNode) bool {
	return c.p.Partition && p.idx == c.partB && c.sch.now >= c.partFrom && c.sch.now < c.partTo
}

func (c *cluster) decodeByID(id core.RankID) *decodeNode {
	for _, d := range c.decodes {
		if d.id == id {
			return d
		}
	}
	return nil
}

func (c *cluster) prefillByID(id core.RankID) *prefillNode {
	for _, p := range c.prefills {
		if p.id == id {
			return p
		}
	}
	return nil
}
