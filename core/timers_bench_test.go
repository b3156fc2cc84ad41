package core

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

// timerSizes are the live-request counts the timer benchmarks compare: the
// cost per tick and per input must not grow with them.
var timerSizes = []int{100, 10_000, 100_000}

// runTimerBench runs op at every size in timerSizes on the pair setup
// builds: 64 warm-up ops (pools, maps, timer queues), then b.N timed ops,
// then check (nil: none) to prove the run was the steady state it claims.
func runTimerBench(b *testing.B, setup func(b *testing.B, live int) *benchPair, op func(p *benchPair), check func(b *testing.B, p *benchPair)) {
	for _, live := range timerSizes {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			p := setup(b, live)
			for i := 0; i < 64; i++ {
				op(p)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				op(p)
			}
			b.StopTimer()
			if check != nil {
				check(b, p)
			}
		})
	}
}

// advance moves the bench clock 10 ms; tickReceiver and tickSender Tick
// one side and deliver what it sent.
func advance(p *benchPair) { p.now = p.now.Add(10 * time.Millisecond) }

func tickReceiver(p *benchPair) {
	p.r.Tick(p.now)
	p.fromR()
	p.flush()
}

func tickSender(p *benchPair) {
	p.s.Tick(p.now)
	p.fromS()
	p.flush()
}

func safePair(b *testing.B, live int) *benchPair { return newBenchPair(b, live, knownunsafe.Safe) }

// BenchmarkReceiverTick: one decode Tick every 10 ms of clock with live
// exposures assigned and nothing due.
func BenchmarkReceiverTick(b *testing.B) {
	runTimerBench(b, safePair, func(p *benchPair) { advance(p); tickReceiver(p) }, nil)
}

// BenchmarkSenderTick: one prefill Tick every 10 ms of clock with live
// streams and nothing due, heartbeats off (a period of an hour).
func BenchmarkSenderTick(b *testing.B) {
	runTimerBench(b, safePair, func(p *benchPair) { advance(p); tickSender(p) }, nil)
}

// newTimerPair is a bench pair whose live background exposures were admitted
// 2^62 ns (146 years) of clock ahead (their leases never lapse while the
// benchmark's clock runs from zero), with a lease short enough that the tombstones of
// the benchmark's own requests expire within a few ticks: what is measured
// is the steady state, tombstone expiry included.
func newTimerPair(b *testing.B, live int) *benchPair {
	return newTimerPairAt(b, live, 2*time.Hour, 100*time.Millisecond, Time(1<<62))
}

func newTimerPairBeat(b *testing.B, live int) *benchPair {
	return newTimerPairAt(b, live, 10*time.Millisecond, 100*time.Millisecond, Time(1<<62))
}

// newTimerPairAt admits and opens live background requests at admitAt,
// then sets the clock to 0.
func newTimerPairAt(b *testing.B, live int, heartbeat, maxHold time.Duration, admitAt Time) *benchPair {
	r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: (live + 64) * benchPages, SlotBytes: 4096,
		Lease: 50 * time.Millisecond, MaxHold: maxHold, MaxTail: time.Millisecond, ClockMargin: time.Millisecond}, 0)
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewSender(SenderConfig{Rank: 0, Session: 1, SkewMargin: time.Millisecond, MaxInflight: 1 << 30, MaxBatchPages: 2,
		Heartbeat: heartbeat, RequestTombstone: time.Millisecond, BootstrapTimeout: 2 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	p := &benchPair{r: r, s: s, live: live, now: admitAt}
	for i := 0; i < live; i++ {
		key := p.next()
		if _, err := r.Admit(key, []RankID{0}, benchPages, p.now); err != nil {
			b.Fatal(err)
		}
		p.fromR()
		p.flush()
		if err := s.Open(key, benchPages, p.now); err != nil {
			b.Fatal(err)
		}
		p.fromS()
		p.flush()
	}
	p.now = 0
	return p
}

// BenchmarkSteadyState: per op, one commit cycle and one abort cycle (the
// inputs), then 10 ms of clock and a Tick on each side, with live requests
// in the background; the tombstones of earlier ops expire as it runs.
func BenchmarkSteadyState(b *testing.B) {
	runTimerBench(b, newTimerPair, func(p *benchPair) {
		p.commitCycle()
		p.abortCycle()
		advance(p)
		tickReceiver(p)
		tickSender(p)
	}, func(b *testing.B, p *benchPair) {
		if m := p.s.Metrics(); m.Tombstones > 64 || m.Requests != p.live {
			b.Fatalf("not a steady state: %d tombstones, %d requests (want %d)", m.Tombstones, m.Requests, p.live)
		}
	})
}

// BenchmarkHeartbeat: one prefill heartbeat (its Tick when the 10 ms period
// passed), decode's handling of it and its Lease back to the rank. The
// heartbeat carries what changed since the last answered one (nothing
// here), not the live tags (docs/design.md §3), so its cost does not grow
// with the live requests.
func BenchmarkHeartbeat(b *testing.B) {
	runTimerBench(b, newTimerPairBeat, func(p *benchPair) { advance(p); tickSender(p) }, func(b *testing.B, p *benchPair) {
		if m := p.s.Metrics(); m.Streams != p.live || m.RankLeases == 0 {
			b.Fatalf("%d live streams (want %d), %d rank leases", m.Streams, p.live, m.RankLeases)
		}
	})
}

// BenchmarkHeartbeatChurn: one commit cycle and one abort cycle, then one
// prefill heartbeat and decode's Lease back, with live requests in the
// background: a heartbeat that carries what changed costs the same at 100
// and 100k live requests.
func BenchmarkHeartbeatChurn(b *testing.B) {
	runTimerBench(b, newTimerPairBeat, func(p *benchPair) {
		p.commitCycle()
		p.abortCycle()
		advance(p)
		tickSender(p)
	}, func(b *testing.B, p *benchPair) {
		if m := p.s.Metrics(); m.Streams != p.live || m.Tombstones > 64 {
			b.Fatalf("not a steady state: %d live streams (want %d), %d tombstones", m.Streams, p.live, m.Tombstones)
		}
	})
}

// BenchmarkRenewedTicks: 10 ms of clock, then a Tick on each side (the
// rank's heartbeat and decode's Lease back included), with live requests
// whose leases are real and renewed only by the rank lease: lease timers
// must not come due once per lease and live request.
func BenchmarkRenewedTicks(b *testing.B) {
	renewed := func(b *testing.B, live int) *benchPair {
		return newTimerPairAt(b, live, 10*time.Millisecond, 1000*time.Hour, 0)
	}
	runTimerBench(b, renewed, func(p *benchPair) { advance(p); tickSender(p); tickReceiver(p) }, func(b *testing.B, p *benchPair) {
		if m := p.s.Metrics(); m.Streams != p.live || m.LeaseLapses != 0 {
			b.Fatalf("not a steady state: %d live streams (want %d), %d lease lapses", m.Streams, p.live, m.LeaseLapses)
		}
	})
}
