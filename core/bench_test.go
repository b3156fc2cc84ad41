package core

import (
	"context"
	"fmt"
	"runtime/pprof"
	"slices"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

// benchPair wires one decode Receiver to one prefill Sender with no network
// in between, so a benchmark measures only the core.
type benchPair struct {
	r     *Receiver
	s     *Sender
	now   Time
	room  uint64
	queue []Envelope
	toS   []bool
	posts []Post
	live  int
	// revokes the receiver asked for; revokeAll confirms them (a fence
	// that answers at once: what is measured is the core's own cost).
	revokes []Tag
	// between, if set, runs after each chunk of an interleaved run,
	// outside the timed part (clock and Ticks, so tombstones expire).
	between func(*benchPair)
}

const benchPages = 4

func newBenchPair(b *testing.B, live int, v knownunsafe.Variant) *benchPair {
	return newBenchPairFence(b, live, v, false)
}

func newBenchPairFence(b *testing.B, live int, v knownunsafe.Variant, fence bool) *benchPair {
	r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: (live + 64) * benchPages, SlotBytes: 4096,
		Lease: time.Hour, MaxHold: 2 * time.Hour, MaxTail: time.Millisecond, ClockMargin: time.Millisecond,
		CanRevoke: fence, Unsafe: v}, 0)
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewSender(SenderConfig{Rank: 0, Session: 1, SkewMargin: time.Millisecond, MaxInflight: 1 << 30, MaxBatchPages: 2,
		Heartbeat: time.Hour, RequestTombstone: time.Millisecond, BootstrapTimeout: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	p := &benchPair{r: r, s: s, live: live}
	// Background: live exposures that stay assigned while cycles run.
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
	return p
}

func (p *benchPair) next() RequestKey {
	p.room++
	p.now++
	return RequestKey{Room: p.room, Gen: 1}
}

func (p *benchPair) fromR() {
	out := p.r.Ready()
	for _, e := range out.Messages {
		p.queue = append(p.queue, e)
		p.toS = append(p.toS, true)
	}
	for _, rv := range out.Revokes {
		p.revokes = append(p.revokes, rv.Tag)
	}
}

// revokeAll confirms every revoke the receiver asked for.
func (p *benchPair) revokeAll() {
	for i := 0; i < len(p.revokes); i++ {
		p.r.Revoked(p.revokes[i], p.now)
		p.fromR()
		p.flush()
	}
	p.revokes = p.revokes[:0]
}

func (p *benchPair) fromS() {
	out := p.s.Ready()
	for _, e := range out.Messages {
		p.queue = append(p.queue, e)
		p.toS = append(p.toS, false)
	}
	p.posts = append(p.posts, out.Posts...)
}

// flush delivers every queued message (and what it causes) in order.
func (p *benchPair) flush() {
	for i := 0; i < len(p.queue); i++ {
		if p.toS[i] {
			p.s.Step(p.queue[i].Msg, p.now)
			p.fromS()
		} else {
			p.r.Step(p.queue[i].Msg, p.now)
			p.fromR()
		}
	}
	p.queue, p.toS = p.queue[:0], p.toS[:0]
}

// completeAll reports every posted batch as Succeeded.
func (p *benchPair) completeAll() {
	for i := 0; i < len(p.posts); i++ {
		if err := p.s.Completed(p.posts[i].Batch, Succeeded, p.now); err != nil {
			panic(err)
		}
		p.fromS()
		p.flush()
	}
	p.posts = p.posts[:0]
}

// commitCycle: admit → assign → write → commit → handoff → finish → release.
func (p *benchPair) commitCycle() {
	key := p.next()
	tag, err := p.r.Admit(key, []RankID{0}, benchPages, p.now)
	if err != nil {
		panic(err)
	}
	p.fromR()
	p.flush()
	_ = p.s.Open(key, benchPages, p.now)
	p.fromS()
	_ = p.s.Finish(key, benchPages, p.now)
	p.fromS()
	p.flush()
	p.completeAll()
	if st, _ := p.r.State(tag); st != StateHanded {
		panic(fmt.Sprintf("not handed off: %v", st))
	}
	_ = p.s.Close(key, p.now)
	if err := p.r.Finish(tag, p.now); err != nil {
		panic(err)
	}
	p.revokeAll()
	if _, held := p.r.State(tag); held {
		panic("commit cycle left the exposure held")
	}
}

// abortCycle: admit → assign → write → abort → drain → DrainAck → release.
func (p *benchPair) abortCycle() {
	key := p.next()
	tag, err := p.r.Admit(key, []RankID{0}, benchPages, p.now)
	if err != nil {
		panic(err)
	}
	p.fromR()
	p.flush()
	_ = p.s.Open(key, benchPages, p.now)
	p.fromS()
	_ = p.s.Produce(key, benchPages, p.now)
	p.fromS()
	p.flush()
	_ = p.r.Abort(tag, ReasonClientAbort, p.now)
	p.fromR()
	p.flush()
	p.completeAll()
	p.revokeAll()
	if _, held := p.r.State(tag); held {
		panic("abort cycle left the exposure held")
	}
	if len(p.s.reqList) != p.live {
		panic("abort cycle left the prefill request open")
	}
}

func benchCycles(b *testing.B, live int, v knownunsafe.Variant, cycle func(*benchPair)) {
	p := newBenchPair(b, live, v)
	for i := 0; i < 64; i++ { // warm the pools and maps
		cycle(p)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cycle(p)
	}
}

// BenchmarkCommitCycle: the normal path at 256 concurrent rooms and at
// 100,000 live exposures.
func BenchmarkCommitCycle(b *testing.B) {
	for _, live := range []int{256, 100_000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			benchCycles(b, live, knownunsafe.Safe, (*benchPair).commitCycle)
		})
	}
}

// BenchmarkAbortCycle: abort → drain → release, safe and the unsafe
// release-on-abort arm.
func BenchmarkAbortCycle(b *testing.B) {
	for _, live := range []int{256, 100_000} {
		for _, v := range []knownunsafe.Variant{knownunsafe.Safe, knownunsafe.ReleaseOnAbort} {
			b.Run(fmt.Sprintf("live=%d/%s", live, v.Name()), func(b *testing.B) {
				benchCycles(b, live, v, (*benchPair).abortCycle)
			})
		}
	}
}

// benchCycleKinds are the cycles a comparison runs each of.
var benchCycleKinds = []struct {
	name  string
	cycle func(*benchPair)
}{{"abort", (*benchPair).abortCycle}, {"commit", (*benchPair).commitCycle}}

// BenchmarkFlatCoreCost (issue 21 item 4): commit and abort cycles with
// 100 and with 100,000 live exposures in the background, interleaved in
// one run; the ratio big/small is the growth (goal: within 1.2). Between
// chunks, untimed, the clock moves 10 ms and both sides Tick, so the
// cycles' own tombstones expire (lease 50 ms) and the small arm stays
// small: without it both arms would carry b.N tombstones.
func BenchmarkFlatCoreCost(b *testing.B) {
	for _, c := range benchCycleKinds {
		b.Run(c.name, func(b *testing.B) {
			small, big := newTimerPair(b, 100), newTimerPair(b, 100_000)
			for _, p := range []*benchPair{small, big} {
				p.between = func(p *benchPair) { advance(p); tickReceiver(p); tickSender(p) }
			}
			for i := 0; i < 64; i++ { // warm the pools and maps
				c.cycle(small)
				c.cycle(big)
			}
			interleaved(b, c.cycle, "live100k", big, "live100", small)
			for _, p := range []*benchPair{small, big} {
				if m := p.s.Metrics(); m.Tombstones > 1024 || m.Requests != p.live {
					b.Fatalf("not a steady state: %d tombstones, %d requests (want %d)", m.Tombstones, m.Requests, p.live)
				}
			}
		})
	}
}

// BenchmarkSafeVsUnsafeAbort measures both arms interleaved in one run and
// reports the safe path's cost as a ratio to the unsafe release-on-abort
// path (noise of the machine hits both arms alike).
func BenchmarkSafeVsUnsafeAbort(b *testing.B) {
	interleaved(b, (*benchPair).abortCycle,
		"safe", newBenchPair(b, 256, knownunsafe.Safe), "unsafe", newBenchPair(b, 256, knownunsafe.ReleaseOnAbort))
}

// BenchmarkRevokeBeforeRelease: what revoke-before-release costs the core
// with a fence, as a ratio to the release-on-drain-ack variant (the
// behaviour before issue 15: slots back on the acks, no revoke), both arms
// interleaved in one run. The revoke itself is answered at once here; its
// latency in a real transport shows in hold durations (the demo's drained
// hold p50/p99), not in the core.
func BenchmarkRevokeBeforeRelease(b *testing.B) {
	for _, c := range benchCycleKinds {
		b.Run(c.name, func(b *testing.B) {
			interleaved(b, c.cycle, "fence-first", newBenchPairFence(b, 256, knownunsafe.Safe, true),
				"ack-trusting", newBenchPairFence(b, 256, knownunsafe.ReleaseOnDrainAck, true))
		})
	}
}

// interleaved runs cycle on arms a and c in alternating chunks and reports
// each arm's ns per cycle, their ratio a/c, and the median of the ratios of
// adjacent chunks (a/c-median): on a shared machine a chunk that another
// process preempted skews the totals but not the median.
func interleaved(b *testing.B, cycle func(*benchPair), nameA string, a *benchPair, nameC string, c *benchPair) {
	const chunk = 64
	var tA, tC time.Duration
	var pairs []float64
	// Profile labels tell the arms apart (go tool pprof -tagfocus arm=...).
	ctx := context.Background()
	ctxA, ctxC := pprof.WithLabels(ctx, pprof.Labels("arm", nameA)), pprof.WithLabels(ctx, pprof.Labels("arm", nameC))
	defer pprof.SetGoroutineLabels(ctx)
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		pprof.SetGoroutineLabels(ctxA)
		t0 := time.Now()
		for i := 0; i < chunk; i++ {
			cycle(a)
		}
		t1 := time.Now()
		pprof.SetGoroutineLabels(ctxC)
		for i := 0; i < chunk; i++ {
			cycle(c)
		}
		dA, dC := t1.Sub(t0), time.Since(t1)
		tA += dA
		tC += dC
		pairs = append(pairs, float64(dA)/float64(dC))
		if a.between != nil || c.between != nil {
			pprof.SetGoroutineLabels(ctx)
			b.StopTimer()
			for _, p := range []*benchPair{a, c} {
				if p.between != nil {
					p.between(p)
				}
			}
			b.StartTimer()
		}
	}
	n := float64((b.N + chunk - 1) / chunk * chunk)
	b.ReportMetric(float64(tA.Nanoseconds())/n, nameA+"-ns/cycle")
	b.ReportMetric(float64(tC.Nanoseconds())/n, nameC+"-ns/cycle")
	b.ReportMetric(float64(tA)/float64(tC), nameA+"/"+nameC)
	slices.Sort(pairs)
	b.ReportMetric(pairs[len(pairs)/2], nameA+"/"+nameC+"-median")
}
