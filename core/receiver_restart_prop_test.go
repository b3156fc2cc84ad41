package core

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

// restartProperties drives a receiver with a restart fence (no revoke; rank
// 0 declares an unbounded tail, rank 1 a bounded one) with random admits,
// aborts, drain acks, deaths, ticks and reaps, and checks after every input:
// a hold over rank 0's unacked writes goes back only as fenced, and only in
// the output of the reap of the instance that served it; nothing is admitted
// on an instance whose restart is pending.
func restartProperties(variant knownunsafe.Variant) func(*rapid.T) {
	return func(t *rapid.T) {
		targets := rapid.IntRange(1, 3).Draw(t, "targets")
		r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 6, Lease: time.Millisecond,
			MaxHold: 3 * time.Millisecond, MaxTail: 300 * us, ClockMargin: 50 * us,
			RestartFence: RestartFenceConfig{Targets: targets, After: time.Duration(rapid.IntRange(100, 2000).Draw(t, "after")) * us},
			Unsafe:       variant}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.RankTail(0, unboundedTail); err != nil {
			t.Fatal(err)
		}
		type shadow struct {
			target   int
			unbound  bool // rank 0 writes it and never acked
			released bool
		}
		tags := map[Tag]*shadow{}
		var order []Tag
		pending := map[int]bool{}
		now := Time(0)
		room := uint64(0)
		for step := 0; step < 60; step++ {
			reaped := -1
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0:
				room++
				ranks := [][]RankID{{0}, {1}, {0, 1}}[rapid.IntRange(0, 2).Draw(t, "ranks")]
				tag, err := r.Admit(RequestKey{Room: room, Gen: 1}, ranks, 1, now)
				if err != nil {
					continue
				}
				target, _ := r.Target(tag)
				if pending[target] {
					t.Fatalf("%s admitted on instance %d while its restart is pending", tag, target)
				}
				tags[tag] = &shadow{target: target, unbound: ranks[0] == 0}
				order = append(order, tag)
			case 1, 2:
				if len(order) == 0 {
					continue
				}
				tag := rapid.SampledFrom(order).Draw(t, "tag")
				if rapid.Bool().Draw(t, "abort") {
					_ = r.Abort(tag, ReasonClientAbort, now)
				} else {
					rank := RankID(rapid.IntRange(0, 1).Draw(t, "rank"))
					if rank == 0 && !tags[tag].released {
						tags[tag].unbound = false
					}
					r.Step(Message{Kind: KindDrainAck, Tag: tag, Rank: rank, Decode: 100, Evidence: EvidenceQuiesced}, now)
				}
			case 3:
				r.PeerDead(RankID(rapid.IntRange(0, 1).Draw(t, "dead")), now)
			case 4:
				now = now.Add(time.Duration(rapid.IntRange(1, 800).Draw(t, "dt")) * us)
				r.Tick(now)
			case 5:
				var ps []int
				for i := 0; i < targets; i++ {
					if pending[i] {
						ps = append(ps, i)
					}
				}
				if len(ps) == 0 {
					continue
				}
				reaped = rapid.SampledFrom(ps).Draw(t, "reap")
				delete(pending, reaped)
				if err := r.TargetRestarted(reaped, now); err != nil {
					t.Fatal(err)
				}
			}
			out := r.Ready()
			for _, rs := range out.Restarts {
				pending[rs.Target] = true
			}
			for _, rel := range out.Releases {
				s := tags[rel.Tag]
				if s == nil {
					continue
				}
				s.released = true
				if s.unbound && (rel.Path != PathFenced || reaped != s.target) {
					t.Fatalf("%s (rank 0 unacked, unbounded tail, instance %d) released by %s (reap of %d)", rel.Tag, s.target, rel.Path, reaped)
				}
			}
		}
	}
}

func TestRestartFenceProperties(t *testing.T) {
	rapid.Check(t, restartProperties(knownunsafe.Safe))
}

// TestRestartFencePropertiesCatchReleaseBeforeReap: the same properties
// fail for the release-before-reap variant.
func TestRestartFencePropertiesCatchReleaseBeforeReap(t *testing.T) {
	failed, msg := propertyFails(t, restartProperties(knownunsafe.ReleaseBeforeReap))
	if !failed {
		t.Fatal("release-before-reap not caught by the restart-fence properties")
	}
	t.Logf("caught: %.160s", msg)
}
