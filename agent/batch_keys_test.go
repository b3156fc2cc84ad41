package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// keyCalls is decode's transport with its key calls counted: a plugin
// without batch keys (as one built before them), or, as batchKeyCalls,
// with them.
type keyCalls struct {
	sdk.Transport
	g                 sdk.Granter
	grants, grantMany atomic.Int64 // single and batch calls
	mu                sync.Mutex
	revokes           [][]sdk.Key // the keys of each revoking call
	single            []bool      // revokes[i] was a single Revoke
}

func (k *keyCalls) Grant(ctx context.Context, w sdk.Window) (sdk.Key, error) {
	k.grants.Add(1)
	return k.g.Grant(ctx, w)
}

func (k *keyCalls) Revoke(ctx context.Context, key sdk.Key) (sdk.RevokeResult, error) {
	k.note([]sdk.Key{key}, true)
	return k.g.Revoke(ctx, key)
}

func (k *keyCalls) note(keys []sdk.Key, single bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.revokes = append(k.revokes, append([]sdk.Key(nil), keys...))
	k.single = append(k.single, single)
}

// revokedIn is how the calls so far revoked keys: the number of calls that
// named any of them, whether they were single calls, and whether every key
// was named.
func (k *keyCalls) revokedIn(keys ...sdk.Key) (calls, singles int, all bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	seen := map[sdk.Key]bool{}
	for i, ks := range k.revokes {
		hit := false
		for _, x := range ks {
			for _, want := range keys {
				if x == want {
					hit, seen[x] = true, true
				}
			}
		}
		if hit {
			calls++
			if k.single[i] {
				singles++
			}
		}
	}
	return calls, singles, len(seen) == len(keys)
}

type batchKeyCalls struct{ *keyCalls }

func (k batchKeyCalls) GrantMany(ctx context.Context, ws []sdk.Window) []sdk.Granted {
	k.grantMany.Add(1)
	return k.g.(sdk.KeyBatcher).GrantMany(ctx, ws)
}

func (k batchKeyCalls) RevokeMany(ctx context.Context, keys []sdk.Key) []sdk.Revoked {
	k.note(keys, false)
	return k.g.(sdk.KeyBatcher).RevokeMany(ctx, keys)
}

// Decode grants an exposure's keys for all its ranks in one call and
// revokes them in one call where the plugin takes batches, and one call
// per key (still working) where it does not. Each arm counts the calls its
// plugin saw, so an agent that went back to per-key calls, or one that
// required batches, fails here.
func TestDecodeBatchesKeysPerExposure(t *testing.T) {
	const shard = 4096
	for _, batch := range []bool{true, false} {
		name := map[bool]string{true: "batch-plugin", false: "pre-batch-plugin"}[batch]
		t.Run(name, func(t *testing.T) {
			plug := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{}).Transport()
			calls := &keyCalls{Transport: plug, g: plug.(sdk.Granter)}
			var tr sdk.Transport = calls
			if batch {
				tr = batchKeyCalls{calls}
			}
			d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 4, ShardBytes: shard, Shards: 2,
				Lease: 10 * time.Second, MaxHold: 20 * time.Second, Fence: true, Revoke: RevokeAtAbort, ControlAddr: "127.0.0.1:0"}, tr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			a, b := newFakeRank(t, d, 1, shard), newFakeRank(t, d, 2, shard)
			// The next request's keys are writer-bound at the first try.
			warmUp(t, d, a, b)
			checkExposureKeyCalls(t, d, calls, batch, a, b)
		})
	}
}

// checkExposureKeyCalls runs one exposure of two ranks, aborts it, and
// checks the key calls its grant and its fence made.
func checkExposureKeyCalls(t *testing.T, d *Decode, calls *keyCalls, batch bool, a, b *fakeRank) {
	t.Helper()
	g0, gm0 := calls.grants.Load(), calls.grantMany.Load()
	rv := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1})
	tag, err := rv.Init(1, []core.RankID{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	_, keysA := a.assign(t, tag)
	_, keysB := b.assign(t, tag)
	if gm, g := calls.grantMany.Load()-gm0, calls.grants.Load()-g0; batch && (gm != 1 || g != 0) || !batch && (gm != 0 || g != 2) {
		t.Fatalf("grants of one exposure of two ranks: %d batch and %d single calls (batch plugin: %v)", gm, g, batch)
	}
	start := time.Now()
	rv.Abort()
	ka, kb := sdk.Key(keysA[0].Key), sdk.Key(keysB[0].Key)
	waitFor(t, "the exposure's fence", func() bool { _, _, all := calls.revokedIn(ka, kb); return all })
	t.Logf("fence revoked the exposure's keys %v after its abort", time.Since(start))
	if n, singles, _ := calls.revokedIn(ka, kb); batch && (n != 1 || singles != 0) || !batch && (n != 2 || singles != 2) {
		t.Fatalf("revocations of one exposure of two ranks: %d calls, %d of them single (batch plugin: %v)", n, singles, batch)
	}
	// Revoked for real: each rank's own key now refuses its write.
	for i, w := range []struct {
		r *fakeRank
		k keyRef
	}{{a, keysA[0]}, {b, keysB[0]}} {
		var c sdk.Completion
		waitFor(t, "the write refused", func() bool {
			c = w.r.write(t, sdk.BatchID(40+i)+sdk.BatchID(time.Now().UnixNano()&0xffff)<<8, w.k, w.k.Base, 0x22)
			return c.Status != sdk.Succeeded
		})
	}
}

// failOne is a batch-keys plugin whose revocation of one key fails (the
// others go), and which knows nothing of key 99.
type failOne struct {
	sdk.Transport
	bad sdk.Key
}

func (f failOne) Grant(context.Context, sdk.Window) (sdk.Key, error) { return 1, nil }
func (f failOne) Revoke(ctx context.Context, k sdk.Key) (sdk.RevokeResult, error) {
	r := f.RevokeMany(ctx, []sdk.Key{k})[0]
	return r.Result, r.Err
}
func (f failOne) GrantMany(context.Context, []sdk.Window) []sdk.Granted { return nil }
func (f failOne) RevokeMany(_ context.Context, keys []sdk.Key) []sdk.Revoked {
	out := make([]sdk.Revoked, len(keys))
	for i, k := range keys {
		switch k {
		case f.bad:
			out[i].Err = errdefs.Errorf(errdefs.Unavailable, "revoke of %d failed", k)
		case 99:
			out[i].Err = errdefs.Errorf(errdefs.NotFound, "unknown key")
		}
	}
	return out
}

// The exposures fenced in one input share one revoking call, and each is
// judged on its own keys: the one whose key failed is not revoked (it
// stays held until its timeout bound), the others are, and an unknown key
// (nothing can write under it) does not hold its exposure back.
func TestRevokeKeysJudgesEachExposure(t *testing.T) {
	d := &Decode{granter: failOne{bad: 3}}
	errs := d.revokeKeys([][]sdk.Key{{1, 2}, {3, 4}, {}, {99, 5}})
	if len(errs) != 4 || errs[0] != nil || errs[2] != nil || errs[3] != nil {
		t.Fatalf("per exposure: %v, want only the second failed", errs)
	}
	if !errdefs.Is(errs[1], errdefs.Unavailable) {
		t.Fatalf("the exposure whose key failed: %v, want its key's unavailable", errs[1])
	}
}
