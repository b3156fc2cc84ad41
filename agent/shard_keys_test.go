package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// shardArm is one way decode binds keys to shard positions, on the TCP
// plugin (which enforces pieces).
type shardArm struct {
	name    string
	bounds  sdk.Bounds
	unbound bool // the control arm: whole-slot keys, no writer binding (the old keys)
}

var shardArms = []shardArm{
	{"pieces", sdk.BoundsPieces, false},
	{"window", sdk.BoundsWindow, false},
	{"no-bounds-control", sdk.BoundsNone, true},
}

func (a shardArm) control() bool { return a.bounds == sdk.BoundsNone }

const (
	skShard  = 4096
	skShards = 2
	skSlotB  = skShard * skShards
	skSlots  = 8
	skPages  = 2
	skHonest = 0x11
	skEvil   = 0xEE
)

func startShardDecode(t *testing.T, arm shardArm) *Decode {
	t.Helper()
	plug := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
	b := arm.bounds
	d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: skSlots, ShardBytes: skShard, Shards: skShards,
		Lease: 30 * time.Second, MaxHold: 60 * time.Second, Fence: true, UnboundKeys: arm.unbound, keyBounds: &b,
		ControlAddr: "127.0.0.1:0"}, plug.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if d.shardKeys != arm.bounds {
		t.Fatalf("decode binds keys as %v, want %v", d.shardKeys, arm.bounds)
	}
	return d
}

// attack: rank writes its evil fill at every shard-aligned offset of
// twice the pool under every distinct key it holds (a key's window starts
// inside the pool, so that reaches every shard from any window), and
// reports the shards outside its own of the exposure that took its bytes,
// and how many of its writes Succeeded.
func attack(t *testing.T, d *Decode, r *fakeRank, keys []keyRef, slots []uint32, pos int, id *sdk.BatchID) (landed []string, succeeded int) {
	t.Helper()
	seen := map[uint64]bool{}
	for _, k := range keys {
		if seen[k.Key] {
			continue
		}
		seen[k.Key] = true
		for off := uint64(0); off < 2*skSlots*skSlotB; off += skShard {
			*id++
			if c := r.write(t, *id, k, off, skEvil); c.Status == sdk.Succeeded {
				succeeded++
			}
		}
	}
	own := map[int64]bool{} // pool offsets of the attacker's own shards
	for _, s := range slots {
		off, _ := d.shardRange(pos)
		own[int64(s)*skSlotB+off] = true
	}
	mem := d.mem.Bytes()
	for s := int64(0); s < skSlots; s++ {
		for p := 0; p < skShards; p++ {
			off := s*skSlotB + int64(p)*skShard
			if !own[off] && (mem[off] == skEvil || mem[off+skShard-1] == skEvil) {
				landed = append(landed, fmt.Sprintf("slot %d shard %d", s, p))
			}
		}
	}
	return landed, succeeded
}

// honest: the victim writes its own shard of every page; each must land.
func honest(t *testing.T, r *fakeRank, keys []keyRef, id *sdk.BatchID) {
	t.Helper()
	for i, k := range keys {
		*id++
		if c := r.write(t, *id, k, k.Base, skHonest); c.Status != sdk.Succeeded {
			t.Fatalf("rank %d's own shard of page %d: %+v", r.rank, i, c)
		}
	}
}

// TestShardKeysRefuseAnotherRanksShard (issue 19 item 2): a co-rank of the
// same request writing at another rank's shard position is refused for
// every key it holds — (a) on its first request (keys not yet bound to its
// writer), (b) with its writer-bound keys, (c) having announced no writer
// (it gets no keys at all) — in the pieces and window arms, on real TCP
// plugin processes. The control arm grants whole-slot keys, as before, and
// the attacker's writes land: the test can fail.
func TestShardKeysRefuseAnotherRanksShard(t *testing.T) {
	for _, arm := range shardArms {
		t.Run(arm.name, func(t *testing.T) {
			d := startShardDecode(t, arm)
			victim, evil := newFakeRank(t, d, 1, skShard), newFakeRank(t, d, 2, skShard)
			id := sdk.BatchID(100)
			var caught []string
			run := func(name string, room uint64, attacker *fakeRank) {
				tag, err := d.NewReceiver(core.RequestKey{Room: room, Gen: 1}).Init(skPages, []core.RankID{victim.rank, attacker.rank})
				if err != nil {
					t.Fatal(err)
				}
				m, vKeys := victim.assign(t, tag)
				_, aKeys := attacker.assign(t, tag)
				honest(t, victim, vKeys, &id)
				if attacker.rank == 3 && !arm.control() && len(aKeys) != 0 {
					t.Fatalf("%s: a rank that announces no writer got %d keys", name, len(aKeys))
				}
				landed, succeeded := attack(t, d, attacker, aKeys, m.Slots, 1, &id)
				t.Logf("%s: the attacker holds %d page keys; %d writes Succeeded; shards outside its own written: %v", name, len(aKeys), succeeded, landed)
				if len(landed) > 0 {
					caught = append(caught, name)
				}
				if !arm.control() && (len(landed) > 0 || succeeded > len(m.Slots)) {
					t.Errorf("%s: rank %d's shards overwritten by rank %d: %v (%d writes Succeeded for %d own shards)", name, victim.rank, attacker.rank, landed, succeeded, len(m.Slots))
				}
				clearEvil(d)
			}
			run("first-request", 1, evil)
			if st := d.Stats(); st.BoundGrants != 0 || st.KeyCalls < 1 {
				t.Fatalf("first request: %d key sets bound to a writer before any rank connected, %d key calls", st.BoundGrants, st.KeyCalls)
			}
			before := d.Stats().BoundGrants
			run("writer-bound", 2, evil)
			if bound := d.Stats().BoundGrants - before; !arm.unbound && bound < 2 {
				t.Fatalf("writer-bound case: %d bound key sets granted, want one per rank", bound)
			}
			mute := newFakeRankAnnouncing(t, d, 3, skShard, false)
			run("no-writer", 3, mute)
			if arm.control() && len(caught) != 3 {
				t.Fatalf("control arm: the whole-slot keys let the attacker land in %v only; the test could not tell", caught)
			}
		})
	}
}

// clearEvil wipes the attack's bytes so the next case judges its own.
func clearEvil(d *Decode) {
	mem := d.mem.Bytes()
	for i, v := range mem {
		if v == skEvil {
			mem[i] = 0
		}
	}
}

// RequireShardKeys refuses to start where keys cannot be bound to shard
// positions (no fence: one pool key; a transport declaring bounds none),
// and starts where they can.
func TestRequireShardKeysRefusesUnboundableKeys(t *testing.T) {
	none := sdk.BoundsNone
	for _, c := range []struct {
		name    string
		fence   bool
		bounds  *sdk.Bounds
		refused bool
	}{{"no-fence", false, nil, true}, {"bounds-none", true, &none, true}, {"pieces", true, nil, false}} {
		t.Run(c.name, func(t *testing.T) {
			plug := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
			var log lockedBuffer
			d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 2, ShardBytes: skShard, Shards: 2,
				Lease: 10 * time.Second, MaxHold: 20 * time.Second, Fence: c.fence, keyBounds: c.bounds, RequireShardKeys: true, ControlAddr: "127.0.0.1:0",
				Logger: hclog.New(&hclog.LoggerOptions{Output: &log, JSONFormat: true, Level: hclog.Info})}, plug.Transport())
			if err == nil {
				defer d.Close()
			}
			if c.refused != (err != nil) || (err != nil && !errdefs.Is(err, errdefs.FailedPrecondition)) {
				t.Fatalf("NewDecode: %v (refusal expected: %v)", err, c.refused)
			}
			t.Logf("NewDecode: %v", err)
			if err == nil && !strings.Contains(log.String(), `"shard_keys":"pieces"`) {
				t.Fatalf("the start-up log does not say how keys are bound: %s", log.String())
			}
		})
	}
}

// A peer speaking control protocol v1 (where keyRef.Base was the slot's
// start and prefill added its shard itself) is refused at link: it would
// write its shard at the wrong offset under v2 keys.
func TestControlV1PeerRefused(t *testing.T) {
	d := startShardDecode(t, shardArms[0])
	_, _, err := dial(context.Background(), d.Addr(), nil, identity{RoleDecode, 0},
		peerHello{Role: RolePrefill, Rank: 1, ShardBytes: skShard, Version: 1, Caps: peerCaps{Quiesce: true}})
	if !errdefs.Is(err, errdefs.FailedPrecondition) || !strings.Contains(err.Error(), "v1") {
		t.Fatalf("a v1 prefill rank: %v, want refused as incompatible", err)
	}
}
