package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

// init exposes a bench request's pages: pool-picked, or in direct mode
// engine pages 0..pages-1 (one request at a time, so they are free).
func (c *benchCluster) init(rv *KVReceiver, pages int) error {
	ranks := []core.RankID{1, 2}
	if c.d.cfg.Engine == nil {
		_, err := rv.Init(pages, ranks)
		return err
	}
	idx := make([]int, pages)
	for i := range idx {
		idx[i] = i
	}
	_, err := rv.InitAt(idx, ranks)
	return err
}

// BenchmarkDirectSplit is the cost of splitting each engine page across
// the engine's per-layer buffers in direct mode: requests of 8 pages of
// 32 KiB (two prefill ranks of 16 KiB shards, TCP plugin processes,
// fence with pieced keys) into one engine buffer, 16 buffers (2 KiB of a
// page each: one write and one key per buffer per rank) and 64 (512 B
// each), rotating between the three clusters in the same run. Reports
// requests per second and each split arm's throughput relative to one
// buffer.
//
//	go test ./agent/ -run '^$' -bench BenchmarkDirectSplit -benchtime 50x
func BenchmarkDirectSplit(b *testing.B) {
	arms := []struct {
		buffers int
		sum     time.Duration
	}{{buffers: 1}, {buffers: 16}, {buffers: 64}}
	cs := make([]*benchCluster, len(arms))
	for i := range arms {
		cs[i] = startBenchClusterWith(b, func(c *DecodeConfig) { c.Engine = benchDirectEngine(b, arms[i].buffers, 2*c.ShardBytes) })
	}
	for i, d := range rotateRequests(b, cs, 8) {
		arms[i].sum = d
	}
	for _, arm := range arms {
		b.ReportMetric(float64(b.N)/arm.sum.Seconds(), fmt.Sprintf("%d-buffers-req/s", arm.buffers))
	}
	one := arms[0].sum.Seconds()
	b.ReportMetric(one/arms[1].sum.Seconds(), "16-buffers/1-buffer-throughput")
	b.ReportMetric(one/arms[2].sum.Seconds(), "64-buffers/1-buffer-throughput")
}

// benchDirectEngine is 64 engine pages of pageB bytes in n host buffers (one
// region: the single-buffer layout; else split evenly).
func benchDirectEngine(b *testing.B, n int, pageB int64) *EngineMemory {
	const pages = 64
	e := &EngineMemory{Pages: pages}
	for range n {
		mem, err := sdk.NewSharedMemory("bench-engine", uint64(pages*pageB/int64(n)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = mem.Close() })
		if n == 1 {
			e.Desc = mem.Desc()
			return e
		}
		e.Buffers = append(e.Buffers, EngineBuffer{Desc: mem.Desc(), PageBytes: pageB / int64(n)})
	}
	return e
}

// rotateRequests warms every cluster with one request (it opens the data
// connections), then runs b.N requests of pages pages on each, rotating
// which cluster goes first, and returns each one's total time: the arms of
// a benchmark measured in the same run under the same load.
func rotateRequests(b *testing.B, cs []*benchCluster, pages int) []time.Duration {
	for _, c := range cs {
		if err := c.request(pages); err != nil {
			b.Fatal(err)
		}
	}
	sums := make([]time.Duration, len(cs))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range cs {
			k := (i + j) % len(cs)
			start := time.Now()
			if err := cs[k].request(pages); err != nil {
				b.Fatal(err)
			}
			sums[k] += time.Since(start)
		}
	}
	b.StopTimer()
	return sums
}
