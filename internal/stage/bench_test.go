package stage

import (
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"
)

// BenchmarkGatherVsCopy stages a 512-token Llama-3-8B-shaped request (32
// layers × K and V = 64 buffers, 8 KV heads × 128 × bf16 = 2 KiB per token,
// page size 1: 64 MiB) from scattered engine pages into kvfence pages, one
// page's runs at a time as KVSender.Fill does, and copies the same bytes as
// one plain copy. Arms alternate within the run; the reported
// gather/copy is plain-copy time over gather time (1 = as fast as memcpy;
// the goal is >= 0.8). "scattered": the request's pages at random pool
// indices; "contiguous": at consecutive ones (a fresh pool's allocator).
func BenchmarkGatherVsCopy(b *testing.B) {
	const nbuf, item, tokens, pool = 64, 2048, 512, 1024
	e := newEngine(nbuf, pool, item, 1)
	l := e.layout(b, 1)
	scattered, contiguous := make([]int32, tokens), make([]int32, tokens)
	for i, p := range rand.Perm(pool)[:tokens] {
		scattered[i], contiguous[i] = int32(p), int32(100+i)
	}
	b.Run("scattered", func(b *testing.B) { benchGather(b, l, scattered) })
	b.Run("contiguous", func(b *testing.B) { benchGather(b, l, contiguous) })
	// Page size 16 (32 pages of 16 tokens, the same 64 MiB): 32 KiB runs.
	e16 := newEngine(nbuf, pool/16, item*16, 1)
	l16 := e16.layout(b, 16)
	pages16 := make([]int32, tokens/16)
	for i, p := range rand.Perm(pool / 16)[:tokens/16] {
		pages16[i] = int32(p)
	}
	b.Run("page16-scattered", func(b *testing.B) { benchGather(b, l16, pages16) })
}

func benchGather(b *testing.B, l *Layout, idx []int32) {
	shard := l.ShardBytes(Slice{0, 1})
	dst := make([]byte, shard*int64(len(idx)))
	plainSrc := make([]byte, len(dst))
	plainDst := make([]byte, len(dst))
	for i := range plainSrc { // untouched memory is the shared zero page: a baseline that never leaves the cache
		plainSrc[i] = byte(i*31) + byte(i>>12)
	}
	var runs []Run
	gather := func() {
		for n, p := range idx {
			runs = l.GatherPage(runs[:0], p, Slice{0, 1}, unsafe.Pointer(&dst[int64(n)*shard]))
			_ = (Host{}).Copy(runs)
		}
	}
	plain := func() { copy(plainDst, plainSrc) }
	gather()
	plain()
	var tg, tp time.Duration
	b.SetBytes(int64(len(dst)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		gather()
		t1 := time.Now()
		plain()
		tp += time.Since(t1)
		tg += t1.Sub(t0)
	}
	b.ReportMetric(float64(tp)/float64(tg), "gather/copy")
	b.ReportMetric(float64(tg.Microseconds())/float64(b.N), "gather-µs/op")
}
