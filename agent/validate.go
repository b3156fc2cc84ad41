package agent

import (
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// Admission and assignment checks: what a router, an engine or a peer asks
// is checked against this rank's own configuration before the core or the
// transport sees it, so that input from elsewhere can be refused but never
// make a rank write outside the memory it was given, or panic.

// checkAdmission refuses an exposure the pool's layout cannot hold (loop
// only). A slot has one shard per tensor-parallel rank (cfg.Shards): a
// request naming more ranks would have rank i write shard i past its slot's
// end — into the next slot, another request's memory.
func (d *Decode) checkAdmission(key core.RequestKey, pages int, ranks []core.RankID) error {
	switch {
	case pages <= 0:
		return errdefs.Errorf(errdefs.InvalidArgument, "request %d/%d: pages must be positive, got %d", key.Room, key.Gen, pages)
	case pages > d.cfg.Slots:
		return errdefs.Errorf(errdefs.InvalidArgument, "request %d/%d: %d pages can never fit a pool of %d slots", key.Room, key.Gen, pages, d.cfg.Slots)
	case len(ranks) == 0:
		return errdefs.Errorf(errdefs.InvalidArgument, "request %d/%d: no prefill rank named", key.Room, key.Gen)
	case len(ranks) > d.cfg.Shards:
		return errdefs.Errorf(errdefs.InvalidArgument, "request %d/%d: %d prefill ranks named, but a slot of decode rank %d holds %d shards",
			key.Room, key.Gen, len(ranks), d.cfg.Rank, d.cfg.Shards)
	}
	for _, r := range ranks {
		if r == d.cfg.Rank {
			return errdefs.Errorf(errdefs.InvalidArgument, "request %d/%d: names decode rank %d itself as a writer", key.Room, key.Gen, r)
		}
	}
	return nil
}

// checkAssign refuses an Assign that would make this prefill rank write
// outside the slot decode declared (loop only): its shard position past the
// slot's end, or keys that do not cover every slot. reason is the metric
// label of a refusal.
func (p *Prefill) checkAssign(m core.Message, keys []keyRef) (pos int, reason string) {
	pos = -1
	for i, r := range m.Ranks {
		if r == p.cfg.Rank {
			pos = i
		}
	}
	switch {
	case pos < 0:
		return -1, "foreign"
	case len(m.Slots) > p.cfg.SourcePages:
		return -1, "oversized" // more pages than any request this rank can open
	case len(keys) != len(m.Slots):
		return -1, "malformed"
	case int64(pos+1)*p.cfg.ShardBytes > p.decode.SlotBytes:
		return -1, "oversized"
	}
	for _, k := range keys {
		if !partsCoverShard(k.Parts, p.cfg.ShardBytes) {
			return -1, "malformed"
		}
	}
	return pos, ""
}

// partsCoverShard: a page split across engine buffers (keyRef.Parts) is
// written piece by piece from the shard's start; the pieces must add up to
// exactly one shard, or this rank would read past its source page or
// leave part of it unwritten.
func partsCoverShard(parts []keyPart, shard int64) bool {
	if len(parts) == 0 {
		return true
	}
	var sum uint64
	for _, part := range parts {
		if part.Len == 0 || part.Len > uint64(shard) {
			return false
		}
		sum += part.Len
	}
	return sum == uint64(shard)
}

// maxAssignedTags bounds the Assigns a prefill rank keeps keys for: those
// of requests it opened (each holds at least one of its source pages) and
// those that came before the engine opened theirs. An honest decode cannot
// get near it; a hostile one cannot grow the rank's memory past it.
func maxAssignedTags(sourcePages int) int { return 2*sourcePages + 1024 }

// expireKeys drops the keys of Assigns whose request this rank never
// opened, once the engine had every chance to (loop only): a router that
// cancelled before opening, or a decode assigning what nobody asked for.
func (p *Prefill) expireKeys() {
	if time.Since(p.swept) < time.Second {
		return
	}
	p.swept = time.Now()
	keep := max(2*p.cfg.BootstrapTimeout+p.cfg.RequestTombstone, 30*time.Second)
	for tag, tk := range p.keys {
		if p.reqs[tag.Key()] == nil && time.Since(tk.at) > keep {
			delete(p.keys, tag)
		}
	}
}
