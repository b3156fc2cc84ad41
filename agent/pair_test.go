package agent

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
)

// startPair starts a decode rank (16 slots of one 4 KiB shard, fenced,
// checked by the content oracle) and a prefill rank 1 linked to it, each
// on its own TCP plugin process. The tweaks adjust the configs; wrap, when
// set, wraps prefill's transport.
func startPair(t testing.TB, dtweak func(*DecodeConfig), ptweak func(*PrefillConfig), wrap func(sdk.Transport) sdk.Transport) (*Decode, *Prefill) {
	t.Helper()
	d, p, _ := startPairPlugin(t, dtweak, ptweak, wrap)
	return d, p
}

// startPairPlugin is startPair, with decode's plugin process (for tests
// that close decode's transport themselves).
func startPairPlugin(t testing.TB, dtweak func(*DecodeConfig), ptweak func(*PrefillConfig), wrap func(sdk.Transport) sdk.Transport) (*Decode, *Prefill, *sdk.Plugin) {
	t.Helper()
	ctx := context.Background()
	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	dcfg := DecodeConfig{Rank: 0, Slots: 16, ShardBytes: 4096, Shards: 1, Lease: 2 * time.Second,
		MaxHold: 10 * time.Second, Fence: true, Check: oracle.Check{}, ControlAddr: "127.0.0.1:0"}
	if dtweak != nil {
		dtweak(&dcfg)
	}
	d, err := NewDecode(ctx, dcfg, dp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	pp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pp.Close() })
	var tr sdk.Transport = pp.Transport()
	if wrap != nil {
		tr = wrap(tr)
	}
	pcfg := PrefillConfig{Rank: 1, DecodeAddr: d.Addr(), SourcePages: 16, ShardBytes: 4096, Lanes: 1,
		MaxInflight: 16, MaxBatchPages: 4, Heartbeat: 100 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
		RequestTombstone: 5 * time.Second, BootstrapTimeout: 5 * time.Second, Events: pp.Events()}
	if ptweak != nil {
		ptweak(&pcfg)
	}
	p, err := NewPrefill(ctx, pcfg, tr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	waitFor(t, "prefill linked", p.Linked)
	return d, p, dp
}

// sendWhole fills prefill rank 1's first n source pages with the oracle's
// identities of key, sends them all and finishes.
func sendWhole(t testing.TB, snd *KVSender, key core.RequestKey, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		oracle.FillShard(snd.Page(i), oracle.PageIdentity{Room: key.Room, Gen: key.Gen, Page: uint32(i), Rank: 1})
	}
	if err := snd.Send(n); err != nil {
		t.Fatal(err)
	}
	if err := snd.Finish(n); err != nil {
		t.Fatal(err)
	}
}
