package stage

import "unsafe"

// Pointers are formed only for the first byte of a run (offsets are summed
// as integers): a pointer one past the end of an allocation is invalid to
// the Go runtime's checks.

// GatherPage appends the runs that copy slice s of engine page idx (every
// buffer's item, in buffer order) into one shard at dst.
func (l *Layout) GatherPage(runs []Run, idx int32, s Slice, dst unsafe.Pointer) []Run {
	ps := int64(l.PageSize)
	var dstOff int64
	for _, b := range l.Bufs {
		tok := b.Item / ps
		part := tok / int64(s.Parts)
		srcOff := int64(idx)*b.Item + int64(s.Part)*part
		for t := int64(0); t < ps; t++ {
			runs = appendRun(runs, Run{Dst: unsafe.Add(dst, dstOff+t*part), Src: unsafe.Add(b.Addr, srcOff+t*tok), N: int(part)})
		}
		dstOff += part * ps
	}
	return runs
}

// GatherPages appends the runs that copy slice s of engine pages idx into
// shards dst[0], dst[1], ... (as GatherPage does for each), buffer by
// buffer: every page's item of one buffer, then the next buffer's.
//
// Why that order: page by page, consecutive runs come from every buffer in
// turn (64 buffers of a Llama-3-8B-shaped pool, hundreds of MiB), so at
// scattered page indices almost every run missed the TLB; buffer by buffer
// they stay within one buffer and the shards' matching offsets for a
// whole stretch. A 64 MiB request at page size 1 and scattered indices
// went from 0.72 to 0.90 of a plain copy's CPU time (bench_test.go, one
// run at load ~19).
func (l *Layout) GatherPages(runs []Run, idx []int32, s Slice, dst []unsafe.Pointer) []Run {
	ps := int64(l.PageSize)
	var dstOff int64
	for _, b := range l.Bufs {
		tok := b.Item / ps
		part := tok / int64(s.Parts)
		for n, i := range idx {
			srcOff := int64(i)*b.Item + int64(s.Part)*part
			for t := int64(0); t < ps; t++ {
				runs = appendRun(runs, Run{Dst: unsafe.Add(dst[n], dstOff+t*part), Src: unsafe.Add(b.Addr, srcOff+t*tok), N: int(part)})
			}
		}
		dstOff += part * ps
	}
	return runs
}

// ScatterPage appends the runs that copy one kvfence slot (shards shard
// images of shardBytes each, shard k holding slice {k, shards} of every
// buffer) into engine page idx. MLA: every shard holds the whole page;
// shard 0 is copied.
func (l *Layout) ScatterPage(runs []Run, slot unsafe.Pointer, shards int, shardBytes int64, mla bool, idx int32) []Run {
	if mla {
		shards = 1
	}
	ps := int64(l.PageSize)
	for k := 0; k < shards; k++ {
		srcOff := int64(k) * shardBytes
		for _, b := range l.Bufs {
			tok := b.Item / ps
			part := tok / int64(shards)
			dstOff := int64(idx)*b.Item + int64(k)*part
			for t := int64(0); t < ps; t++ {
				runs = appendRun(runs, Run{Dst: unsafe.Add(b.Addr, dstOff+t*tok), Src: unsafe.Add(slot, srcOff+t*part), N: int(part)})
			}
			srcOff += part * ps
		}
	}
	return runs
}

// CheckShards refuses a scatter whose shards do not split every token.
func (l *Layout) CheckShards(shards int, mla bool) error {
	if mla {
		return nil
	}
	return Slice{Part: 0, Parts: shards}.check(l)
}

// Check refuses a slice that does not split every token evenly.
func (l *Layout) Check(s Slice) error { return s.check(l) }
