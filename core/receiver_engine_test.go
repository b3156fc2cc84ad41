package core

import (
	"slices"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
)

// Direct mode's engine-chosen pages (EnginePages, AdmitAt).

func engineReceiver(t *testing.T, v knownunsafe.Variant, restarted bool) *Receiver {
	t.Helper()
	r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 4, EnginePages: 16, Lease: time.Millisecond,
		MaxHold: 4 * time.Millisecond, MaxTail: 300 * us, ClockMargin: 50 * us, Restarted: restarted, Unsafe: v}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func wantClass(t *testing.T, err error, c errdefs.Class) {
	t.Helper()
	if !errdefs.Is(err, c) {
		t.Fatalf("got %v, want %s", err, c)
	}
}

// TestAdmitAtLandsAtEnginePages: the Assign names exactly the engine's
// pages, in the engine's order, and the pool-picked Admit is refused.
func TestAdmitAtLandsAtEnginePages(t *testing.T) {
	r := engineReceiver(t, knownunsafe.Safe, false)
	_, err := r.Admit(RequestKey{Room: 1, Gen: 1}, []RankID{0}, 2, 0)
	wantClass(t, err, errdefs.FailedPrecondition)
	if _, err := r.AdmitAt(RequestKey{Room: 1, Gen: 1}, []RankID{0}, []uint32{9, 3, 15}, 0); err != nil {
		t.Fatal(err)
	}
	msgs := r.Ready().Messages
	if len(msgs) != 1 || !slices.Equal(msgs[0].Msg.Slots, []uint32{9, 3, 15}) {
		t.Fatalf("Assign %+v, want slots [9 3 15]", msgs)
	}
	pool, err := NewReceiver(ReceiverConfig{Instance: 1, Slots: 4, Lease: time.Millisecond, MaxHold: time.Millisecond}, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pool.AdmitAt(RequestKey{Room: 1, Gen: 1}, []RankID{0}, []uint32{0}, 0)
	wantClass(t, err, errdefs.FailedPrecondition)
}

// TestAdmitAtRefusesBadPages: out of range and named twice are
// InvalidArgument; above the capacity ResourceExhausted; and a refusal
// lends nothing (the pages of a refused request stay admissible).
func TestAdmitAtRefusesBadPages(t *testing.T) {
	r := engineReceiver(t, knownunsafe.Safe, false)
	k := RequestKey{Room: 1, Gen: 1}
	for _, c := range []struct {
		idx  []uint32
		want errdefs.Class
	}{
		{[]uint32{2, 16}, errdefs.InvalidArgument},
		{[]uint32{2, 5, 2}, errdefs.InvalidArgument},
		{[]uint32{0, 1, 2, 3, 4}, errdefs.ResourceExhausted},
		{nil, errdefs.InvalidArgument},
	} {
		_, err := r.AdmitAt(k, []RankID{0}, c.idx, 0)
		wantClass(t, err, c.want)
		if n := len(r.Ready().Messages); n != 0 {
			t.Fatalf("%v refused but %d messages out", c.idx, n)
		}
	}
	if r.FreeSlots() != 4 {
		t.Fatalf("%d free after refusals, want 4", r.FreeSlots())
	}
	if _, err := r.AdmitAt(k, []RankID{0}, []uint32{2, 5, 16 - 1, 0}, 0); err != nil {
		t.Fatalf("pages of refused requests stayed lent: %v", err)
	}
}

// TestAdmitAtRefusesHeldPage: an engine page whose exposure aborted stays
// lent until the ranks drained (or a fence or the bound): the engine
// naming it again is refused, FailedPrecondition, never lent twice; the
// capacity counts it. After the drain it is admissible. The release-on-
// abort variant lends it again at once: the test would catch it.
func TestAdmitAtRefusesHeldPage(t *testing.T) {
	for _, v := range []knownunsafe.Variant{knownunsafe.Safe, knownunsafe.ReleaseOnAbort} {
		t.Run(v.Name(), func(t *testing.T) {
			r := engineReceiver(t, v, false)
			tag, err := r.AdmitAt(RequestKey{Room: 1, Gen: 1}, []RankID{0}, []uint32{7, 8}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Abort(tag, ReasonClientAbort, Time(10*us)); err != nil {
				t.Fatal(err)
			}
			_, err = r.AdmitAt(RequestKey{Room: 2, Gen: 1}, []RankID{0}, []uint32{1, 8}, Time(20*us))
			if !v.IsSafe() {
				if err == nil {
					return // caught: the held page was lent twice
				}
				t.Fatalf("%s: held page refused (%v): the test would not catch it", v.Name(), err)
			}
			wantClass(t, err, errdefs.FailedPrecondition)
			if _, err := r.AdmitAt(RequestKey{Room: 2, Gen: 1}, []RankID{0}, []uint32{1, 2, 3}, Time(20*us)); !errdefs.IsResourceExhausted(err) {
				t.Fatalf("3 pages with 2 held of 4: got %v, want ResourceExhausted (holds count)", err)
			}
			r.Step(Message{Kind: KindDrainAck, Tag: tag, Rank: 0, Decode: 100}, Time(30*us))
			if rel := r.Ready().Releases; len(rel) != 1 || rel[0].Path != PathDrained {
				t.Fatalf("drain released %+v", rel)
			}
			if _, err := r.AdmitAt(RequestKey{Room: 2, Gen: 1}, []RankID{0}, []uint32{1, 8}, Time(40*us)); err != nil {
				t.Fatalf("after the drain: %v", err)
			}
		})
	}
}

// TestAdmitAtAfterRestartQuarantine: a restarted decode quarantines every
// engine page (an earlier instance's writers may still land there).
func TestAdmitAtAfterRestartQuarantine(t *testing.T) {
	r := engineReceiver(t, knownunsafe.Safe, true)
	_, err := r.AdmitAt(RequestKey{Room: 1, Gen: 1}, []RankID{0}, []uint32{0}, 0)
	wantClass(t, err, errdefs.FailedPrecondition)
	for now := Time(0); now <= Time(10*time.Millisecond); now = now.Add(100 * us) {
		r.Tick(now)
		if _, err := r.AdmitAt(RequestKey{Room: 1, Gen: 1}, []RankID{0}, []uint32{0, 15}, now); err == nil {
			if now < Time(4350*us) {
				t.Fatalf("admitted at %v, inside the quarantine", time.Duration(now))
			}
			return
		}
	}
	t.Fatal("the quarantine never ended")
}
