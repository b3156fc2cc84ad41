package agent

import (
	"context"
	"testing"
	"time"

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
