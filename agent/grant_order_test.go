package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// gatedGranter is the TCP plugin (a real process) whose Grants wait at a
// gate while holding is set, and which records every key it granted and
// every key it revoked.
type gatedGranter struct {
	sdk.Transport
	g       sdk.Granter
	holding atomic.Bool
	gate    chan struct{}
	mu      sync.Mutex
	keys    []sdk.Key
	revoked map[sdk.Key]bool
}

func (g *gatedGranter) Grant(ctx context.Context, w sdk.Window) (sdk.Key, error) {
	if g.holding.Load() {
		<-g.gate
	}
	k, err := g.g.Grant(ctx, w)
	if err == nil {
		g.mu.Lock()
		g.keys = append(g.keys, k)
		g.mu.Unlock()
	}
	return k, err
}

func (g *gatedGranter) Revoke(ctx context.Context, k sdk.Key) (sdk.RevokeResult, error) {
	res, err := g.g.Revoke(ctx, k)
	if err == nil {
		g.mu.Lock()
		g.revoked[k] = true
		g.mu.Unlock()
	}
	return res, err
}

// grantRace admits one exposure while its Grants are held at the gate,
// aborts it (EagerRevoke: the core asks for the revoke at once) and waits
// until the core's revoke was taken up. It reports whether the slots went
// back then, before any key existed, and, after the gate opens and the
// exposure is released, the keys the plugin granted for it.
func grantRace(t *testing.T) (releasedEarly bool, d *Decode, g *gatedGranter) {
	tr := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{}).Transport()
	g = &gatedGranter{Transport: tr, g: tr.(sdk.Granter), gate: make(chan struct{}), revoked: map[sdk.Key]bool{}}
	d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: skSlots, ShardBytes: skShard, Shards: skShards,
		Lease: 30 * time.Second, MaxHold: 60 * time.Second, Fence: true, EagerRevoke: true, ControlAddr: "127.0.0.1:0"}, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	newFakeRank(t, d, 1, skShard) // linked, announcing its writer: it gets keys
	g.holding.Store(true)
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(g.gate)
		}
	}
	t.Cleanup(open) // before Close, which waits for the Grants
	key := core.RequestKey{Room: 1, Gen: 1}
	rv := d.NewReceiver(key)
	tag, err := rv.Init(skPages, []core.RankID{1}) // returns with the Grants still at the gate
	if err != nil {
		t.Fatal(err)
	}
	rv.Abort()
	waitFor(t, "the core's revoke taken up", func() bool {
		asked := true
		d.lp.call(func() {
			if dt := d.tags[key]; dt != nil && dt.tag == tag {
				asked = dt.revokeWanted
			}
		})
		return asked
	})
	releasedEarly = rv.Released()
	open()
	waitFor(t, "the release", rv.Released)
	return releasedEarly, d, g
}

// TestRevokeWaitsForGrantsInFlight (issue 21): decode grants an exposure's
// keys off its loop, so the core may ask to revoke them before they exist.
// The revoke must wait for the Grants: the slots go back (fenced) only
// after every key the plugin granted for them was revoked. The control arm
// (unsafe_grant_order_test.go, -tags kvfenceunsafe) reports Revoked at once
// and its slots go back while the keys are still being made.
func TestRevokeWaitsForGrantsInFlight(t *testing.T) {
	early, d, g := grantRace(t)
	if early {
		t.Fatal("the slots went back while the exposure's Grants were in flight")
	}
	// Revoked reached the core only after revokeKeys returned, and the
	// release only after Revoked: every key must be revoked by now.
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.keys) == 0 {
		t.Fatal("no key was granted: the race was not run")
	}
	for _, k := range g.keys {
		if !g.revoked[k] {
			t.Errorf("key %d was not revoked before the release", k)
		}
	}
	if s := d.Stats(); s.Released["fenced"]+s.Released["drained"] != 1 {
		t.Errorf("released %v, want one fenced or drained release", s.Released)
	}
}
