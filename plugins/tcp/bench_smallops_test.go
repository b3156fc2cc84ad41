package tcp

import (
	"context"
	"crypto/tls"
	"net"
	"syscall"
	"testing"
	"time"
)

// BenchmarkSmallOps: the plugin's own data path (in process, no plugin
// boundary) at 4 KiB, 64 KiB and 1 MiB operations against two baselines measured
// in the same iteration, arms interleaved: plain Go TCP on loopback (what
// issue 13 asks to compare with) and plain Go TLS 1.3 on loopback with this
// plugin's TLS settings (full 16 KiB records), the fair ceiling for an
// encrypted data plane. Each arm moves the same bytes in chunks of the op
// size; the baselines stream with no acknowledgements, the plugin waits for
// every op's acknowledgement (window: batches in flight). The cleartext
// known-unsafe variant is reported too, to separate TLS from the rest. The
// cpu-* ratios compare the process's CPU time (both ends) per arm: less
// sensitive than wall time to other load on the machine.
func BenchmarkSmallOps(b *testing.B) {
	const size = 32 << 20
	for _, c := range []struct {
		name          string
		opBytes       uint64
		ops, inflight int
	}{
		{"4KiB-1op-64inflight", 4 << 10, 1, 64},
		{"64KiB-1op-64inflight", 64 << 10, 1, 64},
		{"64KiB-16ops-8inflight", 64 << 10, 16, 8},
		{"1MiB-1op-8inflight", 1 << 20, 1, 8},
	} {
		b.Run(c.name, func(b *testing.B) {
			sec := newBenchRig(b, benchTCP(b, Config{}), benchTCP(b, Config{}), size)
			clear := newBenchRig(b, benchTCP(b, Config{unsafe: unsafeCleartext}), benchTCP(b, Config{unsafe: unsafeCleartext}), size)
			batches := int(size / (uint64(c.ops) * c.opBytes))
			sec.run(b, c.inflight, c.ops, c.opBytes, c.inflight) // warm up: connect, fault memory in
			clear.run(b, c.inflight, c.ops, c.opBytes, c.inflight)
			// The baselines move the same bytes between the same memory:
			// the sender's source and the receiver's destination mapping
			// (writing into a shared mapping costs more than into the heap).
			rawSrc, rawDst := sec.src.Bytes(), sec.dst.Bytes()
			srv, cli := rawTLSWrappers(b)
			chunk := int(c.opBytes)
			var tSec, tClear, tTCP, tTLS time.Duration
			var cSec, cClear, cTCP, cTLS time.Duration // CPU time of the process (both ends) per arm
			b.SetBytes(size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				cpu := processCPU()
				tTCP += rawStream(b, rawSrc, rawDst, size, chunk, nil, nil)
				cTCP += processCPU() - cpu
				cpu, start := processCPU(), time.Now()
				sec.run(b, batches, c.ops, c.opBytes, c.inflight)
				tSec += time.Since(start)
				cSec += processCPU() - cpu
				cpu = processCPU()
				tTLS += rawStream(b, rawSrc, rawDst, size, chunk, srv, cli)
				cTLS += processCPU() - cpu
				cpu, start = processCPU(), time.Now()
				clear.run(b, batches, c.ops, c.opBytes, c.inflight)
				tClear += time.Since(start)
				cClear += processCPU() - cpu
			}
			b.StopTimer()
			b.ReportMetric(cSec.Seconds()/cTCP.Seconds(), "cpu-plugin/rawtcp")
			b.ReportMetric(cSec.Seconds()/cTLS.Seconds(), "cpu-plugin/rawtls")
			b.ReportMetric(cClear.Seconds()/cTCP.Seconds(), "cpu-cleartext/rawtcp")
			mb := float64(size) * float64(b.N) / (1 << 20)
			b.ReportMetric(mb/tSec.Seconds(), "plugin-MiB/s")
			b.ReportMetric(mb/tTCP.Seconds(), "rawtcp-MiB/s")
			b.ReportMetric(mb/tTLS.Seconds(), "rawtls-MiB/s")
			b.ReportMetric(tTCP.Seconds()/tSec.Seconds(), "plugin/rawtcp")
			b.ReportMetric(tTLS.Seconds()/tSec.Seconds(), "plugin/rawtls")
			b.ReportMetric(tTCP.Seconds()/tClear.Seconds(), "cleartext/rawtcp")
		})
	}
}

// rawTLSWrappers wrap a plain connection pair in TLS 1.3 with the plugin's
// own settings (identity.go), the client's handshake done before the clock
// starts.
func rawTLSWrappers(b *testing.B) (server, client func(net.Conn) net.Conn) {
	sid, err := newIdentity()
	if err != nil {
		b.Fatal(err)
	}
	cid, err := newIdentity()
	if err != nil {
		b.Fatal(err)
	}
	server = func(c net.Conn) net.Conn { return tls.Server(c, sid.serverTLS()) }
	client = func(c net.Conn) net.Conn {
		tc := tls.Client(c, cid.clientTLS(sid.fp))
		if err := tc.HandshakeContext(context.Background()); err != nil {
			b.Fatal(err)
		}
		return tc
	}
	return server, client
}

// processCPU is the user and system time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
