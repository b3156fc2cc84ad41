package agent

import "github.com/kvfence/kvfence/core"

// ContentCheck is an optional hook for an engine (or a test harness) that
// can tell from a page's bytes which request and rank wrote them — a
// canary or per-page mark it writes itself. The agent calls it at the
// moments only the runtime sees: before slots are exposed again (Free: did
// anything land in them while they were released?), at handoff and when
// the engine calls KVReceiver.Finish (Owned: does every shard hold what its
// rank wrote for this request?), and after release (Released: reset the
// shard, so a later write shows at the next Free). What it finds is
// counted (Stats.CorruptPages, kvfence_corrupt_pages_total) and logged; it
// changes no decision — when memory is released is the core's alone. An
// engine whose bytes carry no such mark leaves DecodeConfig.Check nil. In
// this repository the demo's content oracle and gpumem's tests set it.
//
// Its methods run on the agent's event loop: they must be quick and must
// not call back into the agent.
type ContentCheck interface {
	// Free inspects one shard of a slot about to be exposed again. A
	// non-empty answer names whose bytes landed there while it was free: a
	// late write into released memory (I1).
	Free(shard []byte) string
	// Owned reports whether shard holds exactly page's content as written
	// by rank for tag, and if not, whose bytes it holds.
	Owned(shard []byte, tag core.Tag, page int, rank core.RankID) (ok bool, holder string)
	// Released is called for every shard of a released exposure, so that
	// Free can see a later write into the free memory.
	Released(shard []byte)
}

// shards calls f with each shard of each page of dt (loop only).
func (d *Decode) shards(dt *decTag, f func(page int, slot uint32, pos int, shard []byte)) {
	for p, s := range dt.slots {
		mem := d.slotMem(s) // checkEngine refused the check without a host view
		for r := 0; r < d.cfg.Shards; r++ {
			off := int64(r) * d.cfg.ShardBytes
			f(p, s, r, mem[off:off+d.cfg.ShardBytes])
		}
	}
}

// scrub lets the check reset every shard of a released exposure, so that
// any byte a late write puts there while the memory is free is seen at the
// next admission (checkFree). The safe core never lets that happen.
func (d *Decode) scrub(dt *decTag) {
	if d.cfg.Check == nil {
		return
	}
	d.shards(dt, func(_ int, _ uint32, _ int, shard []byte) { d.cfg.Check.Released(shard) })
}

// checkFree looks at the slots a new exposure was given before any rank
// can write them: a shard that carries bytes was written while the memory
// was free (I1), by a request that no longer owned it.
func (d *Decode) checkFree(dt *decTag) {
	if d.cfg.Check == nil {
		return
	}
	dirty := map[int]bool{}
	d.shards(dt, func(p int, s uint32, _ int, shard []byte) {
		if dirty[p] {
			return
		}
		if holder := d.cfg.Check.Free(shard); holder != "" {
			dirty[p] = true
			d.stats.FreeWrites++
			d.stats.CorruptPages++
			d.Metrics.corrupt.Inc()
			d.log.Error("WRITE INTO FREE MEMORY: a late write landed after its slot was released", "slot", s,
				"new_tag", dt.tag, "new_page", p, "holder", holder)
			d.cfg.Check.Released(shard)
		}
	})
}

// verify checks every shard of every page (at handoff and at finish).
func (d *Decode) verify(dt *decTag) {
	if d.cfg.Check == nil {
		return
	}
	d.stats.PagesVerified += len(dt.slots)
	d.Metrics.verified.Add(float64(len(dt.slots)))
	d.shards(dt, func(p int, s uint32, pos int, shard []byte) {
		if pos >= len(dt.ranks) {
			return // a shard no rank of this request writes
		}
		ok, holder := d.cfg.Check.Owned(shard, dt.tag, p, dt.ranks[pos])
		if ok || dt.corrupt[p] {
			return
		}
		if dt.corrupt == nil {
			dt.corrupt = map[int]bool{}
		}
		dt.corrupt[p] = true
		d.stats.CorruptPages++
		d.Metrics.corrupt.Inc()
		d.log.Error("CORRUPT PAGE: holds another request's bytes", "tag", dt.tag, "page", p, "slot", s,
			"shard_rank", dt.ranks[pos], "holder", holder)
	})
}
