package core

import (
	"math"
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestSenderExtremeLeases: whatever leases decode sends (MinTime, MaxTime,
// one tick either side of now), whatever margins and timers the rank is
// configured with (0, 1 ns, 2^62, MaxInt64) and whatever its clock does
// (near either end, going backwards), a rank posts only while now is before
// the latest lease it was granted minus its skew margin, in exact
// arithmetic: no lease or margin wraps into a licence to write.
func TestSenderExtremeLeases(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		durs := []time.Duration{1, time.Millisecond, 1 << 62, math.MaxInt64}
		cfg := SenderConfig{Rank: 0, Session: 1, MaxInflight: 4, MaxBatchPages: 1,
			SkewMargin:       rapid.SampledFrom(append(durs, 0)).Draw(t, "skew"),
			Heartbeat:        rapid.SampledFrom(durs).Draw(t, "heartbeat"),
			RequestTombstone: rapid.SampledFrom(durs).Draw(t, "tombstone"),
			BootstrapTimeout: rapid.SampledFrom(durs).Draw(t, "bootstrap")}
		s, err := NewSender(cfg)
		if err != nil {
			t.Fatal(err)
		}
		now := extremeTimes.start(t)
		key := RequestKey{Room: 1, Gen: 1}
		tag := Tag{Instance: 1, Room: 1, Gen: 1}
		var lease *big.Int // the latest lease the rank was sent
		var batches []BatchID
		for i, steps := 0, rapid.IntRange(1, 40).Draw(t, "steps"); i < steps; i++ {
			now = extremeTimes.step(t, now)
			switch rapid.IntRange(0, 8).Draw(t, "op") {
			case 0:
				_ = s.Open(key, 4, now)
			case 1:
				_ = s.Produce(key, rapid.IntRange(0, 4).Draw(t, "upto"), now)
			case 2, 3:
				l := rapid.SampledFrom([]Time{MinTime, now.Add(-1), now, now.Add(1), now.Add(time.Millisecond), now.Add(1 << 62), MaxTime}).Draw(t, "lease")
				kind := KindAssign
				if rapid.Bool().Draw(t, "grant") {
					kind = KindGrant
				}
				if lease == nil || big.NewInt(int64(l)).Cmp(lease) > 0 {
					lease = big.NewInt(int64(l))
				}
				s.Step(Message{Kind: kind, Tag: tag, Rank: 0, Decode: 100, LeaseUntil: l, Ranks: []RankID{0}, Slots: []uint32{0, 1, 2, 3}}, now)
			case 4:
				s.Tick(now)
			case 5:
				if len(batches) > 0 {
					b := rapid.SampledFrom(batches).Draw(t, "batch")
					_ = s.Completed(b, rapid.SampledFrom([]BatchStatus{Succeeded, InDoubt}).Draw(t, "status"), now)
				}
			case 6:
				s.Step(Message{Kind: KindAbort, Tag: tag, Rank: 0, Decode: 100, LeaseUntil: MaxTime}, now)
			case 7:
				_ = s.Finish(key, rapid.IntRange(1, 4).Draw(t, "total"), now)
			case 8:
				_ = s.Close(key, now)
			}
			checkSenderTimers(t, s, i)
			checkSenderRecords(t, s, i)
			for _, p := range s.Ready().Posts {
				batches = append(batches, p.Batch)
				if lease == nil || big.NewInt(int64(now)).Cmp(new(big.Int).Sub(lease, big.NewInt(int64(cfg.SkewMargin)))) >= 0 {
					t.Fatalf("step %d: posted batch %d at %d, not before lease %v - margin %v", i, p.Batch, now, lease, cfg.SkewMargin)
				}
			}
		}
	})
}

// checkSenderTimers checks the timer queues' promise: every stream whose
// lease may still lapse, every request the bootstrap timeout may end and
// every tombstone is queued no later than its time, so a Tick that looks
// only at due entries acts as a walk of every stream and request would.
func checkSenderTimers(t *rapid.T, s *Sender, step int) {
	for _, st := range s.list {
		if st.state != StreamWaiting && st.state != StreamSending || st.req != nil && st.req.finished && s.donePosting(st) {
			continue
		}
		if lapse := st.lease.Add(-s.cfg.SkewMargin); st.hpos == 0 || st.due > lapse {
			t.Fatalf("step %d: stream %v lapses at %d but is queued at %d (queued %v)", step, st.key, lapse, st.due, st.hpos != 0)
		}
	}
	for _, req := range s.reqList {
		if req.ended || len(req.streams) > 0 {
			continue
		}
		if end := req.openedAt.Add(s.cfg.BootstrapTimeout); req.hpos == 0 || req.due > end {
			t.Fatalf("step %d: request %s times out at %d but is queued at %d (queued %v)", step, req.key, end, req.due, req.hpos != 0)
		}
	}
	s.recs.each(func(k RequestKey, rec *tagRec) {
		for _, tb := range rec.tombs {
			queued := false
			for _, e := range s.tombTimers {
				queued = queued || e.key == tb.key && e.at <= tb.until
			}
			if !queued {
				t.Fatalf("step %d: tombstone %v (until %d) has no timer", step, tb.key, tb.until)
			}
		}
		if !rec.ended {
			return
		}
		queued := false
		for _, e := range s.reqTombTimers {
			queued = queued || e.key == k && e.at <= rec.endUntil
		}
		if !queued {
			t.Fatalf("step %d: request tombstone %s (until %d) has no timer", step, k, rec.endUntil)
		}
	})
}

// checkSenderRecords checks the per-key records (sender_tags.go) against
// the lists: every live stream and open request is found under its key, no
// record is empty, and the tombstone count is the records' sum.
func checkSenderRecords(t *rapid.T, s *Sender, step int) {
	for _, st := range s.list {
		if s.stream(st.key) != st {
			t.Fatalf("step %d: live stream %v is not found under its key", step, st.key)
		}
	}
	for _, req := range s.reqList {
		if s.request(req.key) != req {
			t.Fatalf("step %d: open request %s is not found under its key", step, req.key)
		}
	}
	tombs, streams, reqs := 0, 0, 0
	s.recs.each(func(k RequestKey, rec *tagRec) {
		if rec.empty() {
			t.Fatalf("step %d: the record of %s is empty but kept", step, k)
		}
		tombs += len(rec.tombs)
		streams += len(rec.streams)
		if rec.req != nil {
			reqs++
		}
	})
	if tombs != s.nTombs || streams != len(s.list) || reqs != len(s.reqList) {
		t.Fatalf("step %d: records hold %d tombstones, %d streams, %d requests; counted %d, %d, %d",
			step, tombs, streams, reqs, s.nTombs, len(s.list), len(s.reqList))
	}
}
