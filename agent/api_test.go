package agent

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo/oracle"
)

// The engine-facing API end to end: the prefill engine fills and sends
// pages, Done fires on both sides, decode reads exactly those bytes through
// Pages, Finish and Close give memory back; an aborted request fails with a
// classified error and its handle never reads pages.
func TestEngineAPIRoundTrip(t *testing.T) {
	d, p := startPair(t, nil, nil, nil)
	key := core.RequestKey{Room: 11, Gen: 1}
	rv := d.NewReceiver(key)
	if _, err := rv.Init(3, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	snd := p.NewSender(key)
	if err := snd.Init(3); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < snd.Pages(); i++ {
		oracle.FillShard(snd.Page(i), oracle.PageIdentity{Room: key.Room, Gen: key.Gen, Page: uint32(i), Rank: 1})
		if err := snd.Send(i + 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := snd.Finish(3); err != nil {
		t.Fatal(err)
	}
	for name, done := range map[string]<-chan struct{}{"receiver": rv.Done(), "sender": snd.Done()} {
		select {
		case <-done:
		case <-time.After(waitForBudget):
			t.Fatalf("%s never reached a final state", name)
		}
	}
	if rv.Poll() != PollSuccess || snd.Poll() != PollSuccess || rv.Err() != nil || snd.Err() != nil {
		t.Fatalf("want success on both sides: decode %v (%v), prefill %v (%v)", rv.Poll(), rv.Err(), snd.Poll(), snd.Err())
	}
	pages := rv.Pages()
	if len(pages) != 3 {
		t.Fatalf("Pages() gave %d pages, want 3", len(pages))
	}
	for i, pg := range pages {
		if !bytes.Equal(pg, snd.Page(i)) {
			t.Fatalf("page %d differs from what prefill wrote", i)
		}
	}
	rv.Finish()
	snd.Close()
	waitFor(t, "decode slots back", rv.Released)
	if rv.Poll() != PollSuccess || rv.Pages() != nil {
		t.Fatalf("after Finish: poll %v, pages %d (want Success, none)", rv.Poll(), len(rv.Pages()))
	}

	// Aborted before any page: Failed on decode, with a classified reason.
	key2 := core.RequestKey{Room: 12, Gen: 1}
	rv2 := d.NewReceiver(key2)
	if _, err := rv2.Init(2, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	rv2.Abort()
	<-rv2.Done()
	if err := rv2.Err(); rv2.Poll() != PollFailed || !errdefs.IsUnavailable(err) || rv2.Pages() != nil {
		t.Fatalf("aborted request: poll %v, err %v, pages %d", rv2.Poll(), err, len(rv2.Pages()))
	}
	if st := d.Stats(); st.CorruptPages != 0 || st.PagesVerified == 0 {
		t.Fatalf("oracle: %d corrupt of %d verified", st.CorruptPages, st.PagesVerified)
	}
}

// A full pool and a reused live key are refused with their classes.
func TestEngineAPIErrorsAreClassified(t *testing.T) {
	d, _ := startPair(t, nil, nil, nil)
	if _, err := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1}).Init(17, []core.RankID{1}); !errdefs.IsResourceExhausted(err) && !errdefs.IsInvalidArgument(err) {
		t.Fatalf("17 pages in a 16-slot pool: %v", err)
	}
	if _, err := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1}).Init(2, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1}).Init(2, []core.RankID{1}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a live key admitted twice: %v", err)
	}
}
