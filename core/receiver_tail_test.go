package core

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
)

const us = time.Microsecond

// timeoutRelease admits one page for ranks 0 and 1 at time 0 (lease 1ms),
// declares rank 0's tail (unless zero), aborts at 100us with no rank ever draining and no
// revoke ever confirmed, and ticks every 10us: it returns when the exposure
// was released (0: never within 10ms).
func timeoutRelease(t *testing.T, v knownunsafe.Variant, revoke bool, tail0 time.Duration) Time {
	t.Helper()
	r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 1, Lease: time.Millisecond,
		MaxHold: 4 * time.Millisecond, MaxTail: 300 * us, ClockMargin: 50 * us, CanRevoke: revoke, Unsafe: v}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tail0 != 0 {
		if err := r.RankTail(0, tail0); err != nil {
			t.Fatal(err)
		}
	}
	tag, err := r.Admit(RequestKey{Room: 1, Gen: 1}, []RankID{0, 1}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Abort(tag, ReasonClientAbort, Time(100*us)); err != nil {
		t.Fatal(err)
	}
	for now := Time(100 * us); now <= Time(10*time.Millisecond); now = now.Add(10 * us) {
		r.Tick(now)
		if rel := r.Ready().Releases; len(rel) > 0 {
			if rel[0].Path != PathTimeout {
				t.Fatalf("released by %s, want timeout", rel[0].Path)
			}
			return now
		}
	}
	return 0
}

// TestRankTailBoundsTimeout: a writer whose transport declares a longer tail
// than decode's own keeps its exposure held until lease + its tail + margin,
// and an unconfirmed revoke waits that tail too. The own-tail-only variant
// (decode's MaxTail alone) releases while the writer's bytes may still land.
func TestRankTailBoundsTimeout(t *testing.T) {
	cases := []struct {
		name   string
		revoke bool
		tail0  time.Duration
		want   Time
	}{
		{"undeclared", false, 0, Time(1350 * us)}, // the receiver's own 300us
		{"declared-shorter-than-own", false, 100 * us, Time(1350 * us)},
		{"declared-longer", false, 2 * time.Millisecond, Time(3050 * us)},
		// Revoke requested at 3050us and never confirmed: another 2ms + 50us.
		{"declared-longer-revoke", true, 2 * time.Millisecond, Time(5100 * us)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := timeoutRelease(t, knownunsafe.Safe, c.revoke, c.tail0); got != c.want {
				t.Fatalf("released at %v, want %v", time.Duration(got), time.Duration(c.want))
			}
			got := timeoutRelease(t, knownunsafe.OwnTailOnly, c.revoke, c.tail0)
			if c.tail0 > 300*us && got >= c.want {
				t.Fatalf("own-tail-only released at %v: the test would not catch it", time.Duration(got))
			}
		})
	}
}

// TestRankTailNeverShrinks: a later, shorter declaration (a reconnect over
// another transport) does not cut the bound of writes already posted.
func TestRankTailNeverShrinks(t *testing.T) {
	r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 1, Lease: time.Millisecond,
		MaxHold: 4 * time.Millisecond, MaxTail: 300 * us}, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = r.RankTail(0, 2*time.Millisecond)
	_ = r.RankTail(0, 100*us)
	if got := r.Tail(0); got != 2*time.Millisecond {
		t.Fatalf("tail %v after a shorter declaration, want 2ms", got)
	}
	if err := r.RankTail(0, -1); err == nil {
		t.Fatal("a negative tail was accepted")
	}
}

// TestRankTailExtendsQuarantine: a rank that declares a longer tail while
// the restart quarantine lasts may have written to the earlier instance.
func TestRankTailExtendsQuarantine(t *testing.T) {
	r, err := NewReceiver(ReceiverConfig{Instance: 2, Self: 100, Slots: 1, Lease: time.Millisecond,
		MaxHold: 4 * time.Millisecond, MaxTail: 300 * us, ClockMargin: 50 * us, Restarted: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = r.RankTail(0, 2*time.Millisecond)
	r.Tick(Time(4350 * us)) // our own bound: MaxHold + MaxTail + margin
	if r.FreeSlots() != 0 {
		t.Fatal("quarantine ended at the receiver's own tail")
	}
	r.Tick(Time(6050 * us))
	if r.FreeSlots() != 1 {
		t.Fatal("quarantine did not end at MaxHold + the declared tail + margin")
	}
}

// heldUntil admits one page for rank 0 at time 0 (lease 1ms), aborts it at
// 100us with no drain and no fence, and ticks every 10us up to 10ms: it
// returns when the exposure was released, or -1 if it is still held.
func heldUntil(t *testing.T, r *Receiver) Time {
	t.Helper()
	tag, err := r.Admit(RequestKey{Room: 1, Gen: 1}, []RankID{0}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Abort(tag, ReasonClientAbort, Time(100*us)); err != nil {
		t.Fatal(err)
	}
	if len(r.Ready().Releases) > 0 {
		return Time(100 * us) // at the abort itself
	}
	for now := Time(100 * us); now <= Time(10*time.Millisecond); now = now.Add(10 * us) {
		r.Tick(now)
		if len(r.Ready().Releases) > 0 {
			return now
		}
	}
	return -1
}

// TestDeclaredTailClamped is the regression test for finding 1 of issue 15:
// a Hello declaring MaxTail = MaxInt64 was accepted, lease + tail + margin
// wrapped, and the aborted exposure was released by "timeout" at the abort
// (an honest in-flight write then landed in free memory); 2^62 ns held the
// memory for 146 years. Tails above MaxDeclaredTail are refused now, and the
// rank's writes stay bounded by the receiver's own tail.
func TestDeclaredTailClamped(t *testing.T) {
	for _, tail := range []time.Duration{math.MaxInt64, 1 << 62, DefaultMaxDeclaredTail + 1} {
		r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 1, Lease: time.Millisecond,
			MaxHold: 4 * time.Millisecond, MaxTail: 300 * us, ClockMargin: 50 * us}, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = r.RankTail(0, tail)
		if !errors.Is(err, errdefs.InvalidArgument) || !strings.Contains(err.Error(), "maximum") {
			t.Fatalf("tail %v: want an invalid-argument error naming the maximum, got %v", tail, err)
		}
		if got := r.Tail(0); got != 300*us {
			t.Fatalf("tail %v: a refused declaration changed the rank's tail to %v", tail, got)
		}
		// lease 1ms + own tail 300us + margin 50us.
		if got := heldUntil(t, r); got != Time(1350*us) {
			t.Fatalf("tail %v refused: released at %v, want 1.35ms", tail, time.Duration(got))
		}
	}
	if err := func() error {
		r, _ := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 1, Lease: time.Millisecond, MaxHold: 4 * time.Millisecond}, 0)
		return r.RankTail(0, DefaultMaxDeclaredTail)
	}(); err != nil {
		t.Fatalf("a tail at the default maximum was refused: %v", err)
	}
}

// TestDeclaredTailSaturates: an operator who allows any tail
// (MaxDeclaredTail = MaxInt64) gets a hold that saturates at the end of
// time, never one that wraps into an early release.
func TestDeclaredTailSaturates(t *testing.T) {
	for _, tail := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 1 << 62} {
		r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 1, Lease: time.Millisecond,
			MaxHold: 4 * time.Millisecond, MaxTail: 300 * us, ClockMargin: 50 * us, MaxDeclaredTail: math.MaxInt64}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.RankTail(0, tail); err != nil {
			t.Fatal(err)
		}
		if got := heldUntil(t, r); got != -1 {
			t.Fatalf("tail %v: released at %v, 0 s after the abort's bound wrapped", tail, time.Duration(got))
		}
	}
}

// TestMaxDeclaredTailValidated: the maximum may not be negative or shorter
// than the receiver's own tail; zero means the default.
func TestMaxDeclaredTailValidated(t *testing.T) {
	base := ReceiverConfig{Instance: 1, Self: 100, Slots: 1, Lease: time.Millisecond, MaxHold: 4 * time.Millisecond, MaxTail: time.Second}
	for _, bad := range []time.Duration{-1, time.Second - 1} {
		cfg := base
		cfg.MaxDeclaredTail = bad
		if _, err := NewReceiver(cfg, 0); !errors.Is(err, errdefs.InvalidArgument) {
			t.Fatalf("MaxDeclaredTail %v: want invalid argument, got %v", bad, err)
		}
	}
	r, err := NewReceiver(base, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.CheckTail(0, DefaultMaxDeclaredTail) != nil || r.CheckTail(0, DefaultMaxDeclaredTail+1) == nil {
		t.Fatal("zero MaxDeclaredTail is not the default")
	}
}
