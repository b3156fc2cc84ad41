package core

import (
	"errors"
	"flag"
	"fmt"
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
)

// shadowExposure is the test's own account of one tag, built only from the
// inputs it gave and the outputs it saw.
type shadowExposure struct {
	slots     []uint32
	ranks     []RankID
	committed map[RankID]uint32 // coverage
	drained   map[RankID]bool
	stopped   bool
	handed    bool
	lease     map[RankID]Time // latest lease the rank may post under (Assign, Grant, Lease)
	hold      Time            // HoldUntil of its Assign
	revoked   bool
	finished  bool // the test finished it (after its handoff)
}

func (s *shadowExposure) maxBound(bound func(Time, RankID) *big.Int) *big.Int {
	var b *big.Int
	for _, rk := range s.ranks {
		if x := bound(s.lease[rk], rk); b == nil || x.Cmp(b) > 0 {
			b = x
		}
	}
	return b
}

// TestReceiverProperties drives a Receiver with random inputs (including
// stale, foreign and duplicated messages) and checks after every input that
// handoffs and releases happen only when I2 and I3 allow, and that every
// slot is accounted for exactly once.
func TestReceiverProperties(t *testing.T) {
	rapid.Check(t, receiverProperties(knownunsafe.Safe))
}

func receiverProperties(variant knownunsafe.Variant) func(*rapid.T) {
	return receiverPropertiesWith(variant, ordinaryTimes)
}

// propTimes draws the receiver's configuration, the tails ranks declare,
// the first clock reading and the clock's steps.
type propTimes struct {
	config func(t *rapid.T, cfg *ReceiverConfig)
	tail   func(t *rapid.T) time.Duration // negative: the rank declares none
	start  func(t *rapid.T) Time
	step   func(t *rapid.T, now Time) Time
}

var ordinaryTimes = propTimes{
	config: func(t *rapid.T, cfg *ReceiverConfig) {
		cfg.Lease, cfg.MaxHold, cfg.MaxTail, cfg.ClockMargin = time.Millisecond, 3*time.Millisecond, 300*time.Microsecond, 50*time.Microsecond
	},
	tail: func(t *rapid.T) time.Duration {
		return time.Duration(rapid.SampledFrom([]int{-1, 100, 300, 600, 1000}).Draw(t, "tail")) * time.Microsecond
	},
	start: func(*rapid.T) Time { return 0 },
	step: func(t *rapid.T, now Time) Time {
		return now + Time(rapid.IntRange(0, 400).Draw(t, "dt"))*Time(time.Microsecond)
	},
}

// exactSum is t + ds with no overflow, for checking bounds against the
// mathematics rather than the core's own saturating arithmetic.
func exactSum(t Time, ds ...time.Duration) *big.Int {
	s := big.NewInt(int64(t))
	for _, d := range ds {
		s.Add(s, big.NewInt(int64(d)))
	}
	return s
}

func receiverPropertiesWith(variant knownunsafe.Variant, times propTimes) func(*rapid.T) {
	return func(t *rapid.T) {
		cfg := ReceiverConfig{Instance: 2, Self: 100, Slots: rapid.IntRange(1, 6).Draw(t, "slots"), SlotBytes: 1,
			CanRevoke: rapid.Bool().Draw(t, "revoke"), Unsafe: variant}
		times.config(t, &cfg)
		now := times.start(t)
		r, err := NewReceiver(cfg, now)
		if err != nil {
			t.Fatal(err)
		}
		maxDeclared := cfg.MaxDeclaredTail
		if maxDeclared == 0 {
			maxDeclared = max(DefaultMaxDeclaredTail, cfg.MaxTail)
		}
		// Writers' transports may declare tails longer than ours (RankTail),
		// up to the configured maximum.
		tails := map[RankID]time.Duration{}
		for _, rk := range []RankID{0, 1} {
			tl := times.tail(t)
			if tl < 0 && rapid.Bool().Draw(t, "declare-none") {
				continue
			}
			err := r.RankTail(rk, tl)
			switch refuse := tl < 0 || tl > maxDeclared; {
			case refuse && !errors.Is(err, errdefs.InvalidArgument):
				t.Fatalf("tail %v (maximum %v) not refused as invalid argument: %v", tl, maxDeclared, err)
			case !refuse && err != nil:
				t.Fatalf("tail %v (maximum %v) refused: %v", tl, maxDeclared, err)
			case !refuse:
				tails[rk] = max(tails[rk], tl)
			}
		}
		// bound is the earliest a timeout may release rank rk's writes
		// under a lease, in exact arithmetic.
		bound := func(lease Time, rk RankID) *big.Int {
			return exactSum(lease, max(cfg.MaxTail, tails[rk]), cfg.ClockMargin)
		}
		shadow := map[Tag]*shadowExposure{}
		beats := map[RankID]*beatRank{0: newBeatRank(0, 1), 1: newBeatRank(1, 1)}
		var tags []Tag
		pickTag := func() Tag {
			if len(tags) == 0 || rapid.IntRange(0, 9).Draw(t, "stale") == 0 {
				return Tag{Instance: uint64(rapid.IntRange(1, 2).Draw(t, "inst")), Room: uint64(rapid.IntRange(0, 2).Draw(t, "room")), Gen: uint64(rapid.IntRange(0, 3).Draw(t, "gen"))}
			}
			return rapid.SampledFrom(tags).Draw(t, "tag")
		}
		// A rank lists a tag soon after its Assign: mostly the newest.
		pickStart := func() Tag {
			if len(tags) > 0 && rapid.Bool().Draw(t, "newest") {
				return tags[len(tags)-1]
			}
			return pickTag()
		}
		check := func(step string) {
			out := r.Ready()
			for _, m := range out.Messages {
				if s := shadow[m.Msg.Tag]; s != nil && (m.Msg.Kind == KindAssign || m.Msg.Kind == KindGrant) {
					if old, ok := s.lease[m.To]; !ok || m.Msg.LeaseUntil > old {
						s.lease[m.To] = m.Msg.LeaseUntil
					}
					if m.Msg.Kind == KindAssign {
						s.hold = m.Msg.HoldUntil
					}
				}
				if b := beats[m.To]; b != nil && m.Msg.Kind == KindLease {
					b.onLease(t, m.Msg, now, shadow, step)
				}
			}
			for _, f := range out.Failures {
				if s := shadow[f.Tag]; s != nil {
					s.stopped = true
				}
			}
			for _, h := range out.Handoffs {
				s := shadow[h.Tag]
				if s == nil || s.stopped || s.handed {
					t.Fatalf("%s: handoff of %s that was stopped, handed or unknown", step, h.Tag)
				}
				for _, rk := range s.ranks {
					if cov, ok := s.committed[rk]; !ok || int(cov) < len(s.slots) {
						t.Fatalf("%s: handoff of %s without full coverage from rank %d", step, h.Tag, rk)
					}
				}
				s.handed = true
			}
			for _, rel := range out.Releases {
				s := shadow[rel.Tag]
				if s == nil {
					continue // the restart quarantine
				}
				switch rel.Path {
				case PathCompleted:
					if !s.handed {
						t.Fatalf("%s: completed release of %s that was never handed off", step, rel.Tag)
					}
					if cfg.CanRevoke && !s.revoked && (!s.finished || big.NewInt(int64(now)).Cmp(s.maxBound(bound)) < 0) {
						// Without the revocation, only the bound of every
						// rank's lease and tail lets it go (I6).
						t.Fatalf("%s: completed release of %s before its keys were revoked", step, rel.Tag)
					}
				case PathDrained:
					for _, rk := range s.ranks {
						if _, c := s.committed[rk]; !c && !s.drained[rk] {
							t.Fatalf("%s: drained release of %s without rank %d's drain", step, rel.Tag, rk)
						}
					}
					if cfg.CanRevoke && !s.revoked {
						// Acks are the ranks' word: with a fence, slots go
						// back only after the revocation is confirmed.
						t.Fatalf("%s: drained release of %s before its keys were revoked (a lying rank writes into reused memory)", step, rel.Tag)
					}
				case PathFenced:
					if !s.revoked {
						t.Fatalf("%s: fenced release of %s without revocation evidence", step, rel.Tag)
					}
				case PathTimeout:
					for _, rk := range s.ranks {
						if _, c := s.committed[rk]; !c && !s.drained[rk] && big.NewInt(int64(now)).Cmp(bound(s.lease[rk], rk)) < 0 {
							t.Fatalf("%s: timeout release of %s before rank %d's bound (%d < %s)", step, rel.Tag, rk, now, bound(s.lease[rk], rk))
						}
					}
				default:
					t.Fatalf("%s: release by %s", step, rel.Path)
				}
				if rel.Held < 0 {
					t.Fatalf("%s: release of %s held for %v", step, rel.Tag, rel.Held)
				}
				delete(shadow, rel.Tag)
			}
			used := map[uint32]bool{}
			for tag, s := range shadow {
				for _, sl := range s.slots {
					if used[sl] {
						t.Fatalf("%s: slot %d in two exposures (%s)", step, sl, tag)
					}
					used[sl] = true
				}
			}
			checkTimers(t, r, now, step)
			m := r.Metrics()
			if got := r.FreeSlots() + m.AssignedSlots + m.HeldSlots + m.HandedSlots + m.QuarantinedSlots; got != cfg.Slots || len(used)+r.FreeSlots() != cfg.Slots {
				t.Fatalf("%s: slots do not add up: free %d + %+v, shadow %d", step, r.FreeSlots(), m, len(used))
			}
		}
		ranks := []RankID{0, 1}
		dead := map[RankID]bool{} // declared dead and not linked again
		steps := rapid.IntRange(1, 80).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			now = times.step(t, now)
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); op {
			case 0, 1:
				key := RequestKey{Room: uint64(rapid.IntRange(0, 2).Draw(t, "room")), Gen: uint64(rapid.IntRange(0, 3).Draw(t, "gen"))}
				rs := ranks[:rapid.IntRange(1, 2).Draw(t, "nranks")]
				pages := rapid.IntRange(1, 3).Draw(t, "pages")
				before := r.Metrics()
				tag, err := r.Admit(key, rs, pages, now)
				namesDead := false
				for _, rk := range rs {
					namesDead = namesDead || dead[rk]
				}
				switch {
				case namesDead && !errors.Is(err, errdefs.Unavailable):
					t.Fatalf("admission %s naming a dead rank (ranks %v) not refused as unavailable: %v", key, rs, err)
				case namesDead && (r.Metrics().Admitted != before.Admitted || len(r.Ready().Messages) != 0):
					t.Fatalf("refused admission %s exposed memory or sent messages", key)
				case !namesDead && errors.Is(err, errdefs.Unavailable):
					t.Fatalf("admission %s of live ranks %v refused as unavailable: %v", key, rs, err)
				}
				if err == nil {
					s := &shadowExposure{ranks: append([]RankID(nil), rs...), committed: map[RankID]uint32{}, drained: map[RankID]bool{}, lease: map[RankID]Time{}}
					for _, m := range r.Ready().Messages {
						s.slots = append([]uint32(nil), m.Msg.Slots...)
					}
					shadow[tag] = s
					tags = append(tags, tag)
				}
			case 2:
				_ = r.Abort(pickTag(), ReasonClientAbort, now)
			case 3:
				_ = r.Reject(pickTag(), now)
			case 4, 5, 6:
				tag := pickTag()
				rank := RankID(rapid.IntRange(0, 2).Draw(t, "from"))
				kind := rapid.SampledFrom([]Kind{KindCommit, KindFail, KindDrainAck, KindHeartbeat, KindHeartbeat, KindHeartbeat}).Draw(t, "kind")
				m := Message{Kind: kind, Tag: tag, Rank: rank, Decode: 100}
				if b := beats[rank]; kind == KindHeartbeat && b != nil {
					if rapid.IntRange(0, 3).Draw(t, "quiet") == 0 {
						// Decode ticked last long ago: leases may have
						// lapsed that no Tick acted on yet.
						now += Time(rapid.IntRange(0, 2*int(cfg.Lease/time.Microsecond)).Draw(t, "gap")) * Time(time.Microsecond)
					}
					switch rapid.IntRange(0, 19).Draw(t, "beat") {
					case 0: // a new incarnation of the rank
						beats[rank] = newBeatRank(rank, b.session+1)
						m = beats[rank].beat(t, pickStart)
					case 1:
						if late, ok := b.late(t); ok {
							m = late
						}
					default:
						m = b.beat(t, pickStart)
					}
				}
				if kind == KindCommit {
					m.Coverage = uint32(rapid.IntRange(0, 3).Draw(t, "coverage"))
				}
				if s := shadow[tag]; s != nil && !s.handed {
					for _, rk := range s.ranks {
						if rk == rank {
							switch kind {
							case KindCommit:
								if _, seen := s.committed[rank]; !seen {
									s.committed[rank] = m.Coverage
								}
							case KindDrainAck:
								s.drained[rank] = true
							}
						}
					}
				}
				r.Step(m, now)
			case 7:
				r.Tick(now)
			case 8:
				tag := pickTag()
				if s := shadow[tag]; s != nil && cfg.CanRevoke && rapid.Bool().Draw(t, "revoked") {
					// Only the core's own Aborting or Handed exposures
					// take a revocation as evidence.
					if st, ok := r.State(tag); ok && st != StateAssigned {
						s.revoked = true
					}
					r.Revoked(tag, now)
				} else {
					if s := shadow[tag]; s != nil && s.handed {
						s.finished = true
					}
					_ = r.Finish(tag, now)
				}
			case 9:
				rk := RankID(rapid.IntRange(0, 1).Draw(t, "dead"))
				if dead[rk] && rapid.Bool().Draw(t, "relink") {
					// The rank links again: its Hello reports its tail.
					if err := r.RankTail(rk, tails[rk]); err != nil {
						t.Fatalf("relink of rank %d: %v", rk, err)
					}
					delete(dead, rk)
					continue // RankTail leaves Ready as it was: the last output was checked
				}
				r.PeerDead(rk, now)
				dead[rk] = true
			}
			check(fmt.Sprintf("step %d at %v", i, time.Duration(now)))
		}
	}
}

// checkTimers checks the timer queue's promise: every exposure that time
// alone can make Tick act on is queued no later than that time (or, if that
// time passed, for the next Tick), so a Tick that looks only at due entries
// acts as a walk of every exposure would.
func checkTimers(t *rapid.T, r *Receiver, now Time, step string) {
	for _, e := range r.list {
		due, ok := r.nextDue(e)
		if !ok {
			continue
		}
		if e.hpos == 0 || e.due > max(due, now) {
			t.Fatalf("%s: %s (%s) may be due at %d but is queued at %d (queued %v): a Tick would miss it",
				step, e.tag, e.state, due, e.due, e.hpos != 0)
		}
	}
}

// failRecorder lets a test run a property and see whether it failed,
// instead of failing itself.
type failRecorder struct {
	testing.TB
	failed bool
	msg    string
}

type stopRecording struct{}

func (f *failRecorder) Errorf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
}
func (f *failRecorder) Error(args ...any) { f.failed, f.msg = true, fmt.Sprint(args...) }
func (f *failRecorder) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	panic(stopRecording{})
}
func (f *failRecorder) Fatal(args ...any)   { f.Error(args...); panic(stopRecording{}) }
func (f *failRecorder) FailNow()            { f.failed = true; panic(stopRecording{}) }
func (f *failRecorder) Fail()               { f.failed = true }
func (f *failRecorder) Failed() bool        { return f.failed }
func (f *failRecorder) Logf(string, ...any) {}
func (f *failRecorder) Log(...any)          {}

func propertyFails(t *testing.T, prop func(*rapid.T)) (failed bool, msg string) {
	// Expected failures must not leave replay files in testdata.
	if f := flag.Lookup("rapid.nofailfile"); f != nil {
		old := f.Value.String()
		_ = f.Value.Set("true")
		defer func() { _ = f.Value.Set(old) }()
	}
	// Search longer than the default: it stops at the first failure.
	if f := flag.Lookup("rapid.checks"); f != nil {
		old := f.Value.String()
		_ = f.Value.Set("3000")
		defer func() { _ = f.Value.Set(old) }()
	}
	// Only that the property fails matters here, not the smallest failing
	// case: rapid's default 30 s of minimisation per variant was most of
	// this test's time under -race.
	if f := flag.Lookup("rapid.shrinktime"); f != nil {
		old := f.Value.String()
		_ = f.Value.Set("2s")
		defer func() { _ = f.Value.Set(old) }()
	}
	rec := &failRecorder{TB: t}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stopRecording); !ok {
					panic(r)
				}
			}
		}()
		rapid.Check(rec, prop)
	}()
	return rec.failed, rec.msg
}

// TestReceiverPropertiesCatchUnsafe: the same properties fail for every
// decode-side known-unsafe variant, so they are not a test that cannot fail.
func TestReceiverPropertiesCatchUnsafe(t *testing.T) {
	for _, v := range []knownunsafe.Variant{knownunsafe.ReleaseOnAbort, knownunsafe.UnboundedTimeout,
		knownunsafe.SingleAckTarget, knownunsafe.NoCoverageCheck, knownunsafe.ReleaseOnRemoteFailure, knownunsafe.OwnTailOnly,
		knownunsafe.ReleaseOnDrainAck, knownunsafe.RankLeaseForgotten} {
		failed, msg := propertyFails(t, receiverProperties(v))
		if !failed {
			t.Errorf("%s: the receiver properties did not catch it", v.Name())
			continue
		}
		first := msg
		if i := len(first); i > 160 {
			first = first[:160]
		}
		t.Logf("%s caught: %s", v.Name(), first)
	}
}
