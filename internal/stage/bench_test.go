package stage

import (
	"math/rand/v2"
	"runtime"
	"sort"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// BenchmarkGatherVsCopy stages a 512-token Llama-3-8B-shaped request (32
// layers × K and V = 64 buffers, 8 KV heads × 128 × bf16 = 2 KiB per token,
// page size 1: 64 MiB) from scattered engine pages into kvfence pages, as
// the C ABI does (GatherPages: buffer by buffer, bufmajor-) and page by page
// through each copier arm, and copies the same bytes as one plain copy. Arms alternate within the run; the reported
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

// variant is hostCopy with one choice of streaming and prefetching, an
// arm the chosen Host is measured against.
type variant struct{ least, ahead, pfBytes int }

func (v variant) Copy(runs []Run) error {
	hostCopy(runs, v.least, v.ahead, v.pfBytes)
	return nil
}

// arms are the copiers a gather is timed with: Host, the copy before
// streaming (memmove/0), memmove with Host's prefetching, and streaming
// without prefetching.
var arms = []struct {
	name string
	cp   Copier
}{
	{"", Host{}},
	{"memmove/0-", variant{0, 0, 0}},
	{"memmove/16x128-", variant{0, prefetchAhead, prefetchBytes}},
	{"stream/0-", variant{StreamMin, 0, 0}},
}

// benchGather times, per iteration and in turn, the gather through each
// arm and one plain copy of the same bytes. NAME-gather/copy is the median
// over iterations of plain-copy time over that arm's gather time, in wall
// and in thread CPU time (cpu-): on a machine shared with many processes
// an arm's wall time is mostly waiting for a core.
func benchGather(b *testing.B, l *Layout, idx []int32) {
	shard := l.ShardBytes(Slice{0, 1})
	dst := make([]byte, shard*int64(len(idx)))
	plainSrc := make([]byte, len(dst))
	plainDst := make([]byte, len(dst))
	for i := range plainSrc { // untouched memory is the shared zero page: a baseline that never leaves the cache
		plainSrc[i] = byte(i*31) + byte(i>>12)
	}
	var runs []Run
	ptrs := make([]unsafe.Pointer, len(idx))
	for n := range idx {
		ptrs[n] = unsafe.Pointer(&dst[int64(n)*shard])
	}
	gathers := []func(){func() { // buffer by buffer, in spans of 128 runs: the C ABI's gather
		runs = l.GatherPages(runs[:0], idx, Slice{0, 1}, ptrs)
		for at := 0; at < len(runs); at += 128 {
			Host{}.CopySpan(runs, at, min(at+128, len(runs)))
		}
	}}
	gathers = append(gathers, func() {
		useAVX512 = false
		gathers[0]()
		useAVX512 = true
	}, func() {
		useAVX2, useAVX512 = false, false
		gathers[0]()
		useAVX2, useAVX512 = true, true
	})
	names := []string{"bufmajor-", "bufmajor-avx2-", "bufmajor-sse-"}
	for _, a := range arms { // page by page
		gathers = append(gathers, func() {
			for n, p := range idx {
				runs = l.GatherPage(runs[:0], p, Slice{0, 1}, ptrs[n])
				_ = a.cp.Copy(runs)
			}
		})
		names = append(names, a.name)
	}
	plain := func() { copy(plainDst, plainSrc) }
	for _, g := range gathers {
		g()
	}
	plain()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	wall, cpu := make([][]float64, len(gathers)), make([][]float64, len(gathers))
	b.SetBytes(int64(len(dst)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tw, tc := make([]time.Duration, len(gathers)), make([]time.Duration, len(gathers))
		for k, g := range gathers {
			t0, c0 := time.Now(), threadCPU()
			g()
			tw[k], tc[k] = time.Since(t0), threadCPU()-c0
		}
		t0, c0 := time.Now(), threadCPU()
		plain()
		pw, pc := float64(time.Since(t0)), float64(threadCPU()-c0)
		for k := range gathers {
			wall[k] = append(wall[k], pw/float64(tw[k]))
			cpu[k] = append(cpu[k], pc/float64(tc[k]))
		}
	}
	for k, name := range names {
		b.ReportMetric(median(wall[k]), name+"gather/copy")
		b.ReportMetric(median(cpu[k]), "cpu-"+name+"gather/copy")
	}
}

// median of per-iteration ratios: one stalled iteration on a shared
// machine moves it less than it moves a ratio of sums.
func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// threadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
func threadCPU() time.Duration {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}
