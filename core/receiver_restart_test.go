package core

import (
	"errors"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
)

// unboundedTail is what the non-revoking plugins declare for "no bound"
// (plugins/kit/nocancel): about fifty years.
const unboundedTail = 50 * 365 * 24 * time.Hour

func restartReceiver(t *testing.T, targets int, v knownunsafe.Variant) *Receiver {
	t.Helper()
	r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 8, Lease: time.Millisecond,
		MaxHold: 4 * time.Millisecond, MaxTail: 300 * us, ClockMargin: 50 * us,
		RestartFence: RestartFenceConfig{Targets: targets, After: 500 * us}, Unsafe: v}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func admitOn(t *testing.T, r *Receiver, room uint64, rank RankID, now Time) (Tag, int) {
	t.Helper()
	tag, err := r.Admit(RequestKey{Room: room, Gen: 1}, []RankID{rank}, 1, now)
	if err != nil {
		t.Fatal(err)
	}
	target, ok := r.Target(tag)
	if !ok {
		t.Fatalf("no target for %s", tag)
	}
	return tag, target
}

// TestUnboundedTailNeedsRestartFence: a writer declaring a fifty-year tail
// is refused without a restart fence and admitted with one.
func TestUnboundedTailNeedsRestartFence(t *testing.T) {
	r := restartReceiver(t, 0, knownunsafe.Safe)
	if err := r.RankTail(0, unboundedTail); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("unbounded tail without a restart fence: %v, want invalid-argument", err)
	}
	r = restartReceiver(t, 1, knownunsafe.Safe)
	if err := r.RankTail(0, unboundedTail); err != nil {
		t.Fatalf("unbounded tail with a restart fence refused: %v", err)
	}
	if _, err := NewReceiver(ReceiverConfig{Instance: 1, Slots: 1, Lease: 1, MaxHold: 1,
		RestartFence: RestartFenceConfig{Targets: 1}}, 0); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("restart fence without After accepted: %v", err)
	}
}

// TestRestartFenceEndsUnboundedHold: an aborted exposure whose writer has
// an unbounded tail is held past After (500us, before the other leases lapse), then its instance is restarted: the
// live exposure on the same instance fails (blast radius 1), the exposure on
// the other instance is untouched, nothing is released before
// TargetRestarted, and then both held ones go back as fenced.
func TestRestartFenceEndsUnboundedHold(t *testing.T) {
	r := restartReceiver(t, 2, knownunsafe.Safe)
	if err := r.RankTail(0, unboundedTail); err != nil {
		t.Fatal(err)
	}
	a, ta := admitOn(t, r, 1, 0, 0)
	b, tb := admitOn(t, r, 2, 1, 0)
	c, tc := admitOn(t, r, 3, 1, 0)
	if ta == tb || tc != ta {
		t.Fatalf("targets %d %d %d: want the least loaded instance each time", ta, tb, tc)
	}
	if err := r.Abort(a, ReasonClientAbort, Time(100*us)); err != nil {
		t.Fatal(err)
	}
	var restartAt Time
	for now := Time(100 * us); now < Time(time.Second); now = now.Add(10 * us) {
		r.Tick(now)
		out := r.Ready()
		if len(out.Releases) > 0 {
			t.Fatalf("released %s by %s at %v before any restart", out.Releases[0].Tag, out.Releases[0].Path, time.Duration(now))
		}
		if len(out.Restarts) > 0 {
			if out.Restarts[0].Target != ta || len(out.Restarts) != 1 {
				t.Fatalf("restarts %+v, want target %d", out.Restarts, ta)
			}
			if len(out.Failures) != 1 || out.Failures[0].Tag != c {
				t.Fatalf("failures %+v, want only %s (live on the restarted instance)", out.Failures, c)
			}
			restartAt = now
			break
		}
	}
	if restartAt < Time(600*us) {
		t.Fatalf("restart at %v, want after the 500us threshold", time.Duration(restartAt))
	}
	if m := r.Metrics(); m.RestartFailed != 1 || m.TargetRestarts != 1 {
		t.Fatalf("metrics %+v", m)
	}
	// While restarting, new exposures go to the other instance.
	if _, td := admitOn(t, r, 4, 1, restartAt); td == ta {
		t.Fatalf("admitted on instance %d while it restarts", td)
	}
	r.Tick(restartAt.Add(100 * us))
	if out := r.Ready(); len(out.Releases)+len(out.Restarts) > 0 {
		t.Fatalf("before the reap: %+v", out)
	}
	if err := r.TargetRestarted(ta, restartAt.Add(200*us)); err != nil {
		t.Fatal(err)
	}
	got := map[Tag]ReleasePath{}
	for _, rel := range r.Ready().Releases {
		got[rel.Tag] = rel.Path
	}
	if len(got) != 2 || got[a] != PathFenced || got[c] != PathFenced {
		t.Fatalf("releases after the reap %v, want %s and %s fenced", got, a, c)
	}
	if st, _ := r.State(b); st != StateAssigned {
		t.Fatalf("%s on the other instance is %s", b, st)
	}
	if err := r.TargetRestarted(7, 0); !errors.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("unknown instance: %v", err)
	}
}

// TestRestartFenceDeadWriter: a dead writer on a non-revoking transport gets
// its instance restarted at the next tick, long before its time bound.
func TestRestartFenceDeadWriter(t *testing.T) {
	r := restartReceiver(t, 1, knownunsafe.Safe)
	_, ta := admitOn(t, r, 1, 0, 0)
	r.PeerDead(0, Time(100*us))
	r.Tick(Time(110 * us))
	if out := r.Ready(); len(out.Restarts) != 1 || out.Restarts[0].Target != ta || len(out.Releases) != 0 {
		t.Fatalf("after a dead writer: %+v", out)
	}
	// Rank 1 is alive (naming dead rank 0 would be refused as unavailable).
	if _, err := r.Admit(RequestKey{Room: 9, Gen: 1}, []RankID{1}, 1, Time(120*us)); !errors.Is(err, errdefs.ResourceExhausted) {
		t.Fatalf("admit while the only instance restarts: %v", err)
	}
}

// TestReleaseBeforeReapIsCaught: the unsafe variant gives the holds back
// when the restart is asked for, before the reap; this test tells it apart.
func TestReleaseBeforeReapIsCaught(t *testing.T) {
	r := restartReceiver(t, 1, knownunsafe.ReleaseBeforeReap)
	admitOn(t, r, 1, 0, 0)
	r.PeerDead(0, Time(100*us))
	r.Tick(Time(110 * us))
	if out := r.Ready(); len(out.Restarts) != 1 || len(out.Releases) != 1 || out.Releases[0].Path != PathUnsafe {
		t.Fatalf("release-before-reap did not release at the restart request: %+v", out)
	}
}
