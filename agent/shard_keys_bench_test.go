package agent

import (
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// BenchmarkShardKeys is the cost of binding each rank's keys to its shard
// positions (issue 19 item 2): requests of 8 pages through a decode rank
// and two prefill ranks (TCP plugin processes, writer-bound keys in every
// arm), rotating between three clusters in the same run under the same
// load — pieced keys (one per rank per run of slots), one key per rank per
// shard (bounds window), and the whole-slot keys of before (bounds none) —
// so the ratios compare like with like. Reports requests per second and
// each arm's throughput relative to whole-slot keys.
//
//	go test ./agent/ -run '^$' -bench BenchmarkShardKeys -benchtime 200x
func BenchmarkShardKeys(b *testing.B) {
	arms := []struct {
		name   string
		bounds sdk.Bounds
		c      *benchCluster
		sum    time.Duration
	}{{name: "pieces", bounds: sdk.BoundsPieces}, {name: "per-shard", bounds: sdk.BoundsWindow}, {name: "whole-slot", bounds: sdk.BoundsNone}}
	cs := make([]*benchCluster, len(arms))
	for i := range arms {
		bounds := arms[i].bounds
		arms[i].c = startBenchClusterWith(b, func(c *DecodeConfig) { c.keyBounds = &bounds })
		if got := arms[i].c.d.shardKeys; got != bounds {
			b.Fatalf("%s: decode binds keys as %v", arms[i].name, got)
		}
		cs[i] = arms[i].c
	}
	for i, d := range rotateRequests(b, cs, 8) { // direct_layers_bench_test.go
		arms[i].sum = d
	}
	for _, arm := range arms {
		if st := arm.c.d.Stats(); st.BoundGrants < 2*b.N {
			b.Fatalf("%s: %d writer-bound key sets for %d requests of 2 ranks", arm.name, st.BoundGrants, b.N)
		}
		b.ReportMetric(float64(b.N)/arm.sum.Seconds(), arm.name+"-req/s")
	}
	whole := arms[2].sum.Seconds()
	b.ReportMetric(whole/arms[0].sum.Seconds(), "pieces/whole-slot-throughput")
	b.ReportMetric(whole/arms[1].sum.Seconds(), "per-shard/whole-slot-throughput")
}
