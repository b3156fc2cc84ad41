package agent

import (
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
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
