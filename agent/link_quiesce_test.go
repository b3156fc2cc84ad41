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

// The close handshake (link_quiesce.go): once decode agreed, it exposes no
// request to the rank (Linked false, Init Unavailable) until ResumeLink or a
// new link; an agent holding an Assign never agrees. The unsafe variant,
// decode answering without refusing, is what the Python race test
// (test_idle_close_is_a_handshake_no_assign_is_lost) catches end to end.
func TestQuiesceLinkStopsExposuresUntilResumed(t *testing.T) {
	d, p := startPair(t, nil, nil, nil)
	waitFor(t, "decode sees the rank", func() bool { return d.Linked(1) })
	if !p.QuiesceLink(10 * time.Second) {
		t.Fatal("an idle agent did not agree to close")
	}
	if d.Linked(1) {
		t.Fatal("decode still offers a link its rank agreed to close")
	}
	rv := d.NewReceiver(core.RequestKey{Room: 7, Gen: 1})
	if _, err := rv.Init(2, []core.RankID{1}); !errdefs.IsUnavailable(err) {
		t.Fatalf("exposure over a closing link: got %v, want Unavailable", err)
	}
	if p.QuiesceLink(time.Second) {
		t.Fatal("a second handshake agreed while the first stands")
	}
	p.ResumeLink()
	waitFor(t, "decode offers the link again", func() bool { return d.Linked(1) })
	if _, err := rv.Init(2, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Assign at prefill", func() bool { return p.Stats().Streams > 0 })
	if p.QuiesceLink(10 * time.Second) {
		t.Fatal("an agent holding an Assign agreed to close")
	}
	waitFor(t, "decode carries on after a refusal", func() bool { return d.Linked(1) })
	rv.Abort()
}

// After an agreement, a link that goes down leaves the rank refused until it
// links again (the window between prefill's close and decode noticing it),
// and the agreed prefill installs no new link until ResumeLink.
func TestQuiescedRankIsRefusedUntilItLinksAgain(t *testing.T) {
	d, p := startPair(t, nil, nil, nil)
	waitFor(t, "decode sees the rank", func() bool { return d.Linked(1) })
	if !p.QuiesceLink(10 * time.Second) {
		t.Fatal("an idle agent did not agree to close")
	}
	p.lp.call(func() { p.link.close() }) // as Close would; the agent keeps dialing
	waitFor(t, "decode saw the link go", func() bool {
		up := true
		d.lp.call(func() { up = d.links[1] != nil })
		return !up
	})
	rv := d.NewReceiver(core.RequestKey{Room: 8, Gen: 1})
	if _, err := rv.Init(2, []core.RankID{1}); !errdefs.IsUnavailable(err) {
		t.Fatalf("exposure to a rank that closed after the handshake: got %v, want Unavailable", err)
	}
	time.Sleep(300 * time.Millisecond) // a few redials: none may be installed while agreed
	if p.Linked() || d.Linked(1) {
		t.Fatal("an agreed agent linked again before ResumeLink")
	}
	p.ResumeLink()
	waitFor(t, "the rank linked again", func() bool { return d.Linked(1) })
	if _, err := rv.Init(2, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	rv.Abort()
}

// An exposure's Assign waits for its keys (async_grant.go). Decode must
// answer a close handshake only after it: answered first, prefill agrees
// while the Assign is still to come, closes, and the request fails when
// its lease lapses (seen in CI: test_dp_replicas_without_dp_attention,
// lease-lapsed). The known-unsafe variant answers at once.
func TestQuiesceAnswerWaitsForAssignHeldByGrant(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		name := map[bool]string{false: "safe", true: "known-unsafe-quiesce-early"}[unsafe]
		t.Run(name, func(t *testing.T) {
			agreed, streams := quiesceDuringGrant(t, unsafe)
			t.Logf("%s: prefill agreed to close: %v; streams it then held: %d", name, agreed, streams)
			if agreed != unsafe {
				t.Fatalf("%s: prefill agreed to close while an Assign was still to come: %v (want %v)", name, agreed, unsafe)
			}
			if streams != 1 {
				t.Fatalf("%s: the Assign reached prefill: %d streams, want 1", name, streams)
			}
		})
	}
}

// quiesceDuringGrant exposes a request while its grant is held at the
// gate, runs the close handshake, opens the gate once decode handled the
// handshake, and returns whether prefill agreed and the streams it holds
// once the Assign came.
func quiesceDuringGrant(t *testing.T, unsafe bool) (bool, int) {
	plug := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{}).Transport()
	g := &gatedGrants{Transport: plug, kb: plug.(sdk.KeyBatcher), gate: make(chan struct{})}
	d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 4, ShardBytes: 4096, Shards: 1,
		Lease: 10 * time.Second, MaxHold: 20 * time.Second, Fence: true, ControlAddr: "127.0.0.1:0",
		unsafeQuiesceEarly: unsafe}, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	p := startPrefill(t, d.Addr())
	waitFor(t, "decode sees the rank", func() bool { return d.Linked(1) })
	g.armed.Store(true)
	rv := d.NewReceiver(core.RequestKey{Room: 9, Gen: 1})
	if _, err := rv.Init(1, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	defer rv.Abort()
	answer := make(chan bool, 1)
	go func() { answer <- p.QuiesceLink(30 * time.Second) }()
	waitFor(t, "decode handled the handshake", func() bool { return !d.Linked(1) })
	var agreed bool
	if unsafe {
		agreed = <-answer // answered with the Assign still held: the gate stays shut until then
		close(g.gate)
	} else {
		close(g.gate)
		agreed = <-answer
	}
	waitFor(t, "the Assign at prefill", func() bool { return p.Stats().Streams > 0 })
	if agreed {
		p.ResumeLink()
	}
	return agreed, p.Stats().Streams
}
