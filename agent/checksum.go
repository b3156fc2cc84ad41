package agent

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/kvfence/kvfence/core"
)

// Optional checksums at handoff commit (off by default). A prefill rank
// that computes them puts, in each Commit, a checksum of the shards it
// wrote for the tag (pages 0..coverage-1, in page order); a decode rank that
// requires them recomputes it over its own slots before the Commit reaches
// the core, and a mismatch aborts the request instead of handing it off
// (its memory is then held like any abort's). This catches what the
// lifetime rules cannot: a transport that reports success for bytes that
// did not arrive intact, or bytes overwritten after they landed.
//
// CRC-32C, because it is hardware-accelerated on amd64 and arm64 (the cost
// is measured by BenchmarkCommitChecksum against a copy of the same bytes);
// it guards against accidents, not an adversary on the data path.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksumPresent marks a computed checksum, so that a zero Commit.Checksum
// always means "none" (a CRC of 0 is a legitimate value).
const checksumPresent = 1 << 63

// commitChecksum is the checksum of shards, in order, with their count and
// length folded in so that a missing or truncated shard changes it.
func commitChecksum(shards [][]byte) uint64 {
	var hdr [16]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(shards)))
	crc := crc32.Update(0, castagnoli, hdr[:8])
	for _, s := range shards {
		binary.LittleEndian.PutUint64(hdr[8:], uint64(len(s)))
		crc = crc32.Update(crc, castagnoli, hdr[8:])
		crc = crc32.Update(crc, castagnoli, s)
	}
	return checksumPresent | uint64(crc)
}

// commitChecksum of this rank's source pages 0..coverage-1 of tag's request
// (still held: source pages stay until the tag is acknowledged, I7).
func (p *Prefill) commitChecksum(tag core.Tag, coverage int) uint64 {
	r := p.reqs[tag.Key()]
	if r == nil || coverage > len(r.src) {
		return 0 // decode will refuse the commit: nothing to vouch for
	}
	mem := p.src.Bytes()
	shards := make([][]byte, coverage)
	for i := range shards {
		off := int64(r.src[i]) * p.cfg.ShardBytes
		shards[i] = mem[off : off+p.cfg.ShardBytes]
	}
	return commitChecksum(shards)
}

// checkCommit recomputes a Commit's checksum over the sending rank's
// shards of the tag's slots (loop only). On a mismatch the request is
// aborted: it is never handed off, and its memory is held until the ranks
// drain (or a fence or the bound), like any abort.
func (d *Decode) checkCommit(m core.Message) bool {
	dt := d.tags[m.Tag.Key()]
	if dt == nil || dt.tag != m.Tag {
		return true // stale or unknown: the core deals with it
	}
	pos := -1
	for i, r := range dt.ranks {
		if r == m.Rank {
			pos = i
		}
	}
	if pos < 0 || int(m.Coverage) > len(dt.slots) {
		return true // the core refuses it
	}
	shards := make([][]byte, m.Coverage)
	for i := range shards {
		off := int64(pos) * d.cfg.ShardBytes
		shards[i] = d.slotMem(dt.slots[i])[off : off+d.cfg.ShardBytes] // a host view: checkEngine
	}
	if got := commitChecksum(shards); got == m.Checksum {
		return true
	}
	d.Metrics.checksumBad.Inc()
	d.log.Error("CHECKSUM MISMATCH at commit: request aborted, not handed off", "tag", dt.tag, "rank", m.Rank,
		"coverage", m.Coverage, "sent", m.Checksum)
	if err := d.core.Abort(dt.tag, core.ReasonChecksumMismatch, now()); err != nil {
		d.log.Warn("abort after checksum mismatch refused", "tag", dt.tag, "error", err)
	}
	d.act()
	return false
}
