package agent

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// withoutIsolation is the TCP plugin declaring no RefusalsIsolated, as a
// transport whose refused write fails its neighbours (verbs) declares.
type withoutIsolation struct {
	sdk.Transport
	sdk.Granter
}

func (w withoutIsolation) Info(ctx context.Context) (sdk.Info, error) {
	i, err := w.Transport.Info(ctx)
	i.Capabilities.RefusalsIsolated = false
	return i, err
}

// The default revokes at the abort only where the transport isolates a
// refused write; an explicit order overrides the declaration; no fence,
// no revocation at all.
func TestRevokeOrderFollowsTheTransport(t *testing.T) {
	for _, c := range []struct {
		order          RevokeOrder
		fence, isolate bool
		want           bool
	}{
		{RevokeAuto, true, true, true},
		{RevokeAuto, true, false, false},
		{RevokeAtAbort, true, false, true},
		{RevokeAfterDrain, true, true, false},
		{RevokeAtAbort, false, true, false},
	} {
		var tr sdk.Transport = sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{}).Transport()
		if !c.isolate {
			tr = withoutIsolation{tr, tr.(sdk.Granter)}
		}
		d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 2, ShardBytes: 4096,
			Lease: time.Second, MaxHold: 2 * time.Second, Fence: c.fence, Revoke: c.order, ControlAddr: "127.0.0.1:0"}, tr)
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Stats().RevokeAtAbort; got != c.want {
			t.Errorf("revoke %v, fence %v, refusals isolated %v: revokes at the abort %v, want %v", c.order, c.fence, c.isolate, got, c.want)
		}
		d.Close()
	}
}

func TestRevokeOrderIsChecked(t *testing.T) {
	for _, s := range []string{"auto", "at-abort", "after-drain"} {
		if o, err := ParseRevokeOrder(s); err != nil || o.String() != s {
			t.Errorf("ParseRevokeOrder(%q) = %v, %v", s, o, err)
		}
	}
	if _, err := ParseRevokeOrder("eager"); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Errorf("ParseRevokeOrder(eager): %v, want InvalidArgument", err)
	}
	_, err := NewDecode(context.Background(), DecodeConfig{Slots: 2, ShardBytes: 4096, Revoke: RevokeOrder(7)}, nil)
	if !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Errorf("NewDecode with revoke order 7: %v, want InvalidArgument", err)
	}
}

// A prefill rank whose transport does not isolate refused writes (an older
// plugin; here the TCP plugin made to say so) has its requests' keys
// revoked after their drain even where decode revokes at the abort: at the
// abort a refused write would fail the other requests' batches queued
// beside it. An explicit at-abort order overrides the rank's declaration.
func TestRevokeAtAbortWaitsForTheDrainOfAnUnisolatedRank(t *testing.T) {
	for _, c := range []struct {
		isolated bool
		order    RevokeOrder
		want     uint64 // revocations left for the drain
	}{{true, RevokeAuto, 0}, {false, RevokeAuto, 1}, {false, RevokeAtAbort, 0}} {
		isolated := c.isolated
		wrap := func(tr sdk.Transport) sdk.Transport {
			if isolated {
				return tr
			}
			return withoutIsolation{tr, tr.(sdk.Granter)}
		}
		d, _ := startPair(t, func(cfg *DecodeConfig) { cfg.Revoke = c.order }, nil, wrap)
		if !d.Stats().RevokeAtAbort {
			t.Fatal("decode on the TCP plugin does not revoke at the abort")
		}
		rv := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1})
		if _, err := rv.Init(2, []core.RankID{1}); err != nil {
			t.Fatal(err)
		}
		rv.Abort()
		waitFor(t, "aborted request released", rv.Released)
		// Revoked only after every rank acknowledged its drain, the hold
		// ends drained; at the abort it ends fenced or, if the drain
		// acknowledgement overtook the revocation, drained.
		st := d.Stats()
		if st.Core.RevokesAfterDrain != c.want || c.want > 0 && st.Released["fenced"] != 0 {
			t.Errorf("prefill isolates refusals %v, revoke %v: revocations left for the drain %d (want %d), released %v",
				isolated, c.order, st.Core.RevokesAfterDrain, c.want, st.Released)
		}
	}
}
