package tcp

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkVsRawTLS is issue 21's yardstick: the plugin's data path (in
// process, both ends, every write acknowledged) against plain Go TLS 1.3
// with the plugin's own settings streaming the same bytes between the same
// memory in chunks of the op size, with plain TCP and the cleartext
// known-unsafe variant beside them to show what encryption costs. Each
// iteration is one round of the four arms, their order reversed every other
// round so that neither gains from going first; every ratio is taken within
// a round and reported as the median over rounds with its spread (min and
// max as metrics; the log adds the quartiles). Run it with enough rounds for a spread to mean something:
//
//	go test -run XXX -bench VsRawTLS -benchtime 15x ./plugins/tcp/
//
// plugin/rawtls and cleartext/rawtcp are bandwidth ratios (more is
// better), cpu-plugin/rawtls is CPU time per byte (less is better; the
// process's user and system time, both ends: steadier than wall time on a
// loaded machine), rawtls/rawtcp and plugin/cleartext are what encryption
// leaves of cleartext bandwidth. A fifth arm runs the plugin with every
// write acknowledged on its own (ackingEach): held/ackeach and
// cpu-held/ackeach are what holding acknowledgements (acks.go) gains.
func BenchmarkVsRawTLS(b *testing.B) {
	for _, c := range []struct {
		name          string
		opBytes       uint64
		ops, inflight int
	}{
		{"4KiB-1op-64inflight", 4 << 10, 1, 64}, // below the sizes: holding acknowledgements must not cost here
		{"64KiB-16ops-8inflight", 64 << 10, 16, 8},
		{"64KiB-1op-64inflight", 64 << 10, 1, 64},
		{"1MiB-1op-8inflight", 1 << 20, 1, 8},
		{"8MiB-1op-4inflight", 8 << 20, 1, 4},
	} {
		b.Run(c.name, func(b *testing.B) {
			benchVsRawTLS(b, c.opBytes, c.ops, c.inflight)
		})
	}
}

// armTime is one arm's wall and CPU time in one round.
type armTime struct{ wall, cpu time.Duration }

func benchVsRawTLS(b *testing.B, opBytes uint64, ops, inflight int) {
	const size = 32 << 20
	sec := newBenchRig(b, benchTCP(b, Config{}), benchTCP(b, Config{}), size)
	clear := newBenchRig(b, benchTCP(b, Config{unsafe: unsafeCleartext}), benchTCP(b, Config{unsafe: unsafeCleartext}), size)
	batches := int(size / (uint64(ops) * opBytes))
	sec.run(b, inflight, ops, opBytes, inflight) // warm up: connect, fault memory in
	clear.run(b, inflight, ops, opBytes, inflight)
	src, dst := sec.src.Bytes(), sec.dst.Bytes()
	srv, cli := rawTLSWrappers(b)
	arms := []func() armTime{
		func() armTime { return timed(func() { sec.run(b, batches, ops, opBytes, inflight) }) },
		func() armTime { return rawArm(b, src, dst, size, int(opBytes), srv, cli) },
		func() armTime { return timed(func() { clear.run(b, batches, ops, opBytes, inflight) }) },
		func() armTime { return rawArm(b, src, dst, size, int(opBytes), nil, nil) },
		func() armTime { return ackingEach(func() { sec.run(b, batches, ops, opBytes, inflight) }) },
	}
	var plugin, rawTLS, clearText, rawTCP, ackEach []armTime
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var t [5]armTime
		for k := range arms {
			j := k
			if i%2 == 1 {
				j = len(arms) - 1 - k
			}
			t[j] = arms[j]()
		}
		plugin, rawTLS, clearText, rawTCP = append(plugin, t[0]), append(rawTLS, t[1]), append(clearText, t[2]), append(rawTCP, t[3])
		ackEach = append(ackEach, t[4])
	}
	b.StopTimer()
	wall := func(num, den []armTime) []float64 {
		return ratios(num, den, func(a armTime) time.Duration { return a.wall })
	}
	cpu := func(num, den []armTime) []float64 {
		return ratios(num, den, func(a armTime) time.Duration { return a.cpu })
	}
	var line strings.Builder
	for _, r := range []struct {
		name string
		v    []float64
	}{
		{"plugin/rawtls", wall(rawTLS, plugin)},
		{"cpu-plugin/rawtls", cpu(plugin, rawTLS)},
		{"cleartext/rawtcp", wall(rawTCP, clearText)},
		{"rawtls/rawtcp", wall(rawTCP, rawTLS)},
		{"plugin/cleartext", wall(clearText, plugin)},
		{"held/ackeach", wall(ackEach, plugin)},
		{"cpu-held/ackeach", cpu(plugin, ackEach)},
	} {
		q := quartiles(r.v)
		b.ReportMetric(q[2], r.name)
		b.ReportMetric(q[0], r.name+"-min")
		b.ReportMetric(q[4], r.name+"-max")
		fmt.Fprintf(&line, "; %s %.2f [%.2f–%.2f] (%.2f–%.2f)", r.name, q[2], q[1], q[3], q[0], q[4])
	}
	b.ReportMetric(mibPerSec(size, plugin), "plugin-MiB/s")
	b.ReportMetric(mibPerSec(size, rawTLS), "rawtls-MiB/s")
	b.Logf("%d rounds, median [quartiles] (min–max):%s", b.N, line.String())
}

// ackingEach is the plugin arm with every write asking for its
// acknowledgement at once: the receiver then writes one per write, as
// wire version 3 did (acks.go); the yardstick of what holding them saves.
// The writer reads markAckNow after Post hands it the batch (a channel),
// and the arm is over only once every batch completed.
func ackingEach(f func()) armTime {
	mark := markAckNow
	markAckNow = func(bool, bool) bool { return true }
	defer func() { markAckNow = mark }()
	return timed(f)
}

// timed runs f and returns its wall and CPU time.
func timed(f func()) armTime {
	cpu, start := processCPU(), time.Now()
	f()
	return armTime{time.Since(start), processCPU() - cpu}
}

// ratios is, round by round, the num arm's time over the den arm's: with
// the baseline's time as num, a bandwidth ratio.
func ratios(num, den []armTime, of func(armTime) time.Duration) []float64 {
	r := make([]float64, len(num))
	for i := range num {
		r[i] = of(num[i]).Seconds() / of(den[i]).Seconds()
	}
	return r
}

// quartiles is the min, first quartile, median, third quartile and max of
// v (nearest rank).
func quartiles(v []float64) [5]float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(p float64) float64 { return s[int(p*float64(len(s)-1)+0.5)] }
	return [5]float64{s[0], at(0.25), at(0.5), at(0.75), s[len(s)-1]}
}

func mibPerSec(size int, t []armTime) float64 {
	var d time.Duration
	for _, a := range t {
		d += a.wall
	}
	return float64(size) * float64(len(t)) / (1 << 20) / d.Seconds()
}

// rawArm streams total bytes from src into dst in chunks over one loopback
// connection (wrapped as rawStream does: nil, plain TCP), timing from the
// first byte written to the receiver's one-byte answer after the last: the
// dial and the TLS handshake are outside the clock.
func rawArm(b *testing.B, src, dst []byte, total, chunk int, server, client func(net.Conn) net.Conn) armTime {
	asIs := func(c net.Conn) net.Conn { return c }
	if server == nil {
		server = asIs
	}
	if client == nil {
		client = asIs
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() { done <- rawReceive(ln, server, dst, total, chunk) }()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	c := client(raw)
	t := timed(func() {
		for n := 0; n < total; n += chunk {
			if _, err = c.Write(src[n%len(src) : n%len(src)+chunk]); err != nil {
				return
			}
		}
		var one [1]byte
		_, err = io.ReadFull(c, one[:])
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return t
}

// rawReceive accepts one connection and reads total bytes into dst in
// chunks, then answers one byte.
func rawReceive(ln net.Listener, server func(net.Conn) net.Conn, dst []byte, total, chunk int) error {
	raw, err := ln.Accept()
	if err != nil {
		return err
	}
	defer raw.Close()
	c := server(raw)
	for n := 0; n < total; n += chunk {
		if _, err := io.ReadFull(c, dst[n%len(dst):n%len(dst)+chunk]); err != nil {
			return err
		}
	}
	_, err = c.Write([]byte{1})
	return err
}
