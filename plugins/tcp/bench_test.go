package tcp

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// benchRig is a sender and a receiver with memory registered, a grant over
// the whole destination, and a connected peer. Completions are read here.
type benchRig struct {
	s, r     sdk.Transport
	src, dst *sdk.SharedMemory
	srcID    sdk.RegionID
	key      sdk.Key
	peer     sdk.PeerID
	nextID   sdk.BatchID
}

func newBenchRig(b *testing.B, s, r sdk.Transport, size uint64) *benchRig {
	ctx := context.Background()
	g := &benchRig{s: s, r: r}
	var err error
	if g.src, err = sdk.NewSharedMemory("bsrc", size); err != nil {
		b.Fatal(err)
	}
	if g.dst, err = sdk.NewSharedMemory("bdst", size); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.src.Close(); g.dst.Close() })
	if g.srcID, err = s.RegisterMemory(ctx, g.src.Desc()); err != nil {
		b.Fatal(err)
	}
	dstID, err := r.RegisterMemory(ctx, g.dst.Desc())
	if err != nil {
		b.Fatal(err)
	}
	if g.key, err = r.(sdk.Granter).Grant(ctx, sdk.Window{Region: dstID, Length: size}); err != nil {
		b.Fatal(err)
	}
	ep, _ := r.LocalEndpoint(ctx)
	if g.peer, err = s.Connect(ctx, ep); err != nil {
		b.Fatal(err)
	}
	return g
}

// run posts count batches of ops writes of opBytes each, keeping up to
// window batches in flight, and waits for every completion.
func (g *benchRig) run(b *testing.B, count, ops int, opBytes uint64, window int) {
	ctx := context.Background()
	size := uint64(len(g.src.Bytes()))
	inflight := 0
	for posted := 0; posted < count || inflight > 0; {
		for posted < count && inflight < window {
			g.nextID++
			bt := sdk.Batch{ID: g.nextID, Peer: g.peer, Ops: make([]sdk.Op, ops)}
			for i := range bt.Ops {
				off := (uint64(posted*ops+i) * opBytes) % (size - opBytes + 1)
				bt.Ops[i] = sdk.Op{Kind: sdk.OpWrite, LocalRegion: g.srcID, LocalOffset: off, RemoteKey: g.key, RemoteOffset: off, Length: opBytes}
			}
			if err := g.s.Post(ctx, bt); err != nil {
				b.Fatal(err)
			}
			posted++
			inflight++
		}
		c := <-g.s.Completions()
		if c.Status != sdk.Succeeded {
			b.Fatalf("batch %d: %v %s", c.Batch, c.Status, c.Detail)
		}
		inflight--
	}
}

// rawCopy is the baseline: the same bytes through one plain Go TCP
// connection on loopback, read into a buffer of the same size.
func rawCopy(b *testing.B, src, dst []byte, total int, chunk int) time.Duration {
	return rawStream(b, src, dst, total, chunk, nil, nil)
}

// rawStream is rawCopy with the accepted and the dialled connection wrapped
// (nil: used as they are); rawTLSCopy wraps them in TLS. It is rawArm's
// wall time (bench_rawtls_test.go).
func rawStream(b *testing.B, src, dst []byte, total, chunk int, server, client func(net.Conn) net.Conn) time.Duration {
	return rawArm(b, src, dst, total, chunk, server, client).wall
}

// BenchmarkBandwidthVsRawTCP: plugin write bandwidth (two plugin processes,
// payload through shared memory and the TCP plugin's socket) against a plain
// Go TCP copy of the same bytes and a plain Go TLS 1.3 copy with the
// plugin's TLS settings, all three in each iteration; reports both ratios,
// so what is encryption (rawtls/raw) and what is the plugin (plugin/rawtls)
// can be told apart.
// At 64 KiB operations the plugin boundary's cost per batch (a gRPC call and
// a completion message) weighs in; BenchmarkSmallOps measures the data path
// alone.
func BenchmarkBandwidthVsRawTCP(b *testing.B) {
	for _, opBytes := range []uint64{64 << 10, 1 << 20} {
		b.Run(itoa(int(opBytes>>10))+"KiB-ops", func(b *testing.B) {
			const size, ops = 64 << 20, 16
			s := sdktest.Subprocess(b, pluginBin, sdk.OpenOptions{})
			r := sdktest.Subprocess(b, pluginBin, sdk.OpenOptions{})
			g := newBenchRig(b, s.Transport(), r.Transport(), size)
			g.run(b, 4, ops, opBytes, 4) // warm up
			rawDst := make([]byte, size) // allocated and faulted in once, like the plugin's mapping
			for i := range rawDst {
				rawDst[i] = 1
			}
			srv, cli := rawTLSWrappers(b)
			var plugin, raw, rawTLS time.Duration
			b.SetBytes(size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				g.run(b, int(size/(ops*opBytes)), ops, opBytes, 4)
				plugin += time.Since(start)
				raw += rawCopy(b, g.src.Bytes(), rawDst, size, int(opBytes))
				rawTLS += rawStream(b, g.src.Bytes(), rawDst, size, int(opBytes), srv, cli)
			}
			b.StopTimer()
			mb := float64(size) * float64(b.N) / (1 << 20)
			b.ReportMetric(mb/plugin.Seconds(), "plugin-MiB/s")
			b.ReportMetric(mb/raw.Seconds(), "raw-MiB/s")
			b.ReportMetric(mb/rawTLS.Seconds(), "rawtls-MiB/s")
			b.ReportMetric(raw.Seconds()/plugin.Seconds(), "plugin/raw")
			b.ReportMetric(rawTLS.Seconds()/plugin.Seconds(), "plugin/rawtls")
			b.ReportMetric(raw.Seconds()/rawTLS.Seconds(), "rawtls/raw")
		})
	}
}

// BenchmarkBatchCost: per-batch cost through the plugin boundary (gRPC to a
// plugin process) against calling the same transport in process, at 1, 16
// and 256 writes of 4 KiB per batch, 64 batches in flight.
func BenchmarkBatchCost(b *testing.B) {
	for _, ops := range []int{1, 16, 256} {
		b.Run(itoa(ops)+"-writes", func(b *testing.B) {
			sp := sdktest.Subprocess(b, pluginBin, sdk.OpenOptions{})
			rp := sdktest.Subprocess(b, pluginBin, sdk.OpenOptions{})
			out := newBenchRig(b, sp.Transport(), rp.Transport(), 4<<20)
			inS, inR := benchTCP(b, Config{}), benchTCP(b, Config{})
			in := newBenchRig(b, inS, inR, 4<<20)
			const perIter = 64
			var tOut, tIn time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				out.run(b, perIter, ops, 4096, 64)
				tOut += time.Since(start)
				start = time.Now()
				in.run(b, perIter, ops, 4096, 64)
				tIn += time.Since(start)
			}
			b.StopTimer()
			n := float64(b.N * perIter)
			b.ReportMetric(tOut.Seconds()*1e6/n, "plugin-µs/batch")
			b.ReportMetric(tIn.Seconds()*1e6/n, "inproc-µs/batch")
			b.ReportMetric(n/tOut.Seconds(), "plugin-batches/s")
			b.ReportMetric(n/tIn.Seconds(), "inproc-batches/s")
			b.ReportMetric(tIn.Seconds()/tOut.Seconds(), "plugin/inproc")
		})
	}
}

// BenchmarkEncryptionCost: the TLS data plane against the cleartext one it
// replaced (the known-unsafe cleartext variant: the same code without TLS),
// in process, the two arms alternating in each iteration; reports the
// bandwidth of each and tls/cleartext.
func BenchmarkEncryptionCost(b *testing.B) {
	const size = 32 << 20
	for _, opBytes := range []uint64{64 << 10, 1 << 20} {
		b.Run(itoa(int(opBytes>>10))+"KiB-ops", func(b *testing.B) {
			sec := newBenchRig(b, benchTCP(b, Config{}), benchTCP(b, Config{}), size)
			clear := newBenchRig(b, benchTCP(b, Config{unsafe: unsafeCleartext}), benchTCP(b, Config{unsafe: unsafeCleartext}), size)
			ops := int((1 << 20) / opBytes) // 1 MiB per batch
			if ops < 1 {
				ops = 1
			}
			batches := int(size / (uint64(ops) * opBytes))
			sec.run(b, 4, ops, opBytes, 8) // warm up: connect, fault memory in
			clear.run(b, 4, ops, opBytes, 8)
			var tSec, tClear time.Duration
			b.SetBytes(2 * size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				sec.run(b, batches, ops, opBytes, 8)
				tSec += time.Since(start)
				start = time.Now()
				clear.run(b, batches, ops, opBytes, 8)
				tClear += time.Since(start)
			}
			b.StopTimer()
			mb := float64(size) * float64(b.N) / (1 << 20)
			b.ReportMetric(mb/tSec.Seconds(), "tls-MiB/s")
			b.ReportMetric(mb/tClear.Seconds(), "cleartext-MiB/s")
			b.ReportMetric(tClear.Seconds()/tSec.Seconds(), "tls/cleartext")
		})
	}
}

func benchTCP(b *testing.B, cfg Config) *Transport {
	t, err := New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = t.Close() })
	return t
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}
