package sdk_test

import (
	"context"
	"os"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/plugins/tcp"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// BenchmarkBoundary: the TCP transport as a sender in process, and as a
// plugin process over the rings (asynchronous Post, the default), over the
// rings with SyncPost, and over
// gRPC (KVFENCE_RINGS=off), all
// posting one-write batches (64 in flight) to one in-process receiver.
// The arms take turns within each iteration, so load on this shared
// machine hits them alike; the metrics are per batch and the boundary's
// added cost (out of process minus in process, same run). Noisy under
// contention: read the ratios, not the absolute numbers.
func BenchmarkBoundary(b *testing.B) {
	bin, err := sdktest.BuildPlugin(b.TempDir(), "github.com/kvfence/kvfence/plugins/tcp/cmd/kvfence-plugin-tcp")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	newTCP := func() *tcp.Transport {
		t, err := tcp.New(tcp.Config{}, hclog.NewNullLogger())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = t.Close() })
		return t
	}
	recv := newTCP()
	rings := sdktest.Subprocess(b, bin, sdk.OpenOptions{SyncPost: true})
	async := sdktest.Subprocess(b, bin, sdk.OpenOptions{})
	os.Setenv("KVFENCE_RINGS", "off")
	grpcPath := sdktest.Subprocess(b, bin, sdk.OpenOptions{})
	os.Unsetenv("KVFENCE_RINGS")
	if rings.DataPath() != sdk.DataPathRings || grpcPath.DataPath() != sdk.DataPathGRPC {
		b.Fatalf("data paths %s and %s, want rings and grpc", rings.DataPath(), grpcPath.DataPath())
	}
	const size = 64 << 20
	rig := func(s sdk.Transport, pid int) *sdktest.BoundaryRig {
		g, err := sdktest.NewBoundaryRig(ctx, s, recv, pid, size)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(g.Close)
		return g
	}
	arms := []struct {
		name string
		rig  *sdktest.BoundaryRig
	}{
		{"in", rig(newTCP(), 0)},
		{"rings", rig(rings.Transport(), rings.Pid())},
		{"grpc", rig(grpcPath.Transport(), grpcPath.Pid())},
		{"async", rig(async.Transport(), async.Pid())},
	}
	for _, size := range []struct {
		name string
		op   uint64
	}{{"4k", 4 << 10}, {"64k", 64 << 10}, {"1m", 1 << 20}} {
		b.Run(size.name, func(b *testing.B) {
			const chunk, window = 128, 64
			sums := make([]float64, len(arms))
			for _, a := range arms { // warm up
				if _, err := a.rig.Run(ctx, chunk, window, size.op); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range arms {
					k := (i + j) % len(arms) // rotate which arm goes first
					r, err := arms[k].rig.Run(ctx, chunk, window, size.op)
					if err != nil {
						b.Fatal(err)
					}
					sums[k] += r.MicrosPerBatch()
				}
			}
			in, ring, grpc, async := sums[0]/float64(b.N), sums[1]/float64(b.N), sums[2]/float64(b.N), sums[3]/float64(b.N)
			b.ReportMetric(in, "in-us/batch")
			b.ReportMetric(ring, "rings-us/batch")
			b.ReportMetric(grpc, "grpc-us/batch")
			b.ReportMetric(ring-in, "rings-added-us/batch")
			b.ReportMetric(in/ring, "rings-throughput-ratio")
			b.ReportMetric(in/grpc, "grpc-throughput-ratio")
			b.ReportMetric(async-in, "async-added-us/batch")
			b.ReportMetric(in/async, "async-throughput-ratio")
		})
	}
}
