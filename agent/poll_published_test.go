package agent

import (
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/oracle"
)

// Poll (and Pages) read what the loop published: they answer while the loop is
// busy (a fill piece, or a loop preempted on a loaded host), where the old
// Poll, a turn of the loop (pollInLoop), waits for it.
func TestPollAnswersWhileTheLoopIsBusy(t *testing.T) {
	d, p := startPair(t, nil, nil, nil)
	rv, snd := openBoth(t, d, p, core.RequestKey{Room: 21, Gen: 1}, 1)
	for name, lp := range map[string]*loop{"decode": d.lp, "prefill": p.lp} {
		held, release := make(chan struct{}), make(chan struct{})
		go lp.call(func() { close(held); <-release })
		<-held
		got := make(chan PollState, 3)
		go func() { got <- rv.Poll(); got <- snd.Poll(); _ = rv.Pages(); got <- 0 }()
		for i := 0; i < 3; i++ {
			select {
			case <-got:
			case <-time.After(30 * time.Second): // a hang detector, not a timing
				close(release)
				t.Fatalf("%s loop busy: Poll waited for it", name)
			}
		}
		close(release)
	}
	snd.Abort()
	rv.Abort()
}

// The published state is what the loop's tables say, at every settled
// point of a request that succeeds, one decode aborts and one prefill
// aborts.
func TestPublishedPollMatchesTheLoop(t *testing.T) {
	d, p := startPair(t, nil, nil, nil)
	same := func(what string, rv *KVReceiver, snd *KVSender) {
		t.Helper()
		// Read in the loop: every change happens there, so the two agree
		// exactly unless a change site forgot to publish.
		var r, rp, s, sp PollState
		d.lp.call(func() { r, rp = rv.pollInLoop(), PollState(rv.pub.Load()) })
		p.lp.call(func() { s, sp = snd.pollInLoop(), PollState(snd.pub.Load()) })
		if rp != r || sp != s {
			t.Fatalf("%s: published decode %v prefill %v, loop says %v %v", what, rp, sp, r, s)
		}
		// The published pages too: a stale pointer after release would
		// let a scatter read slots another request owns.
		var pl, pp [][]byte
		d.lp.call(func() { pl, pp = rv.pagesInLoop(), rv.Pages() })
		if len(pl) != len(pp) || (pl == nil) != (pp == nil) {
			t.Fatalf("%s: published %d pages (nil %v), loop says %d (nil %v)", what, len(pp), pp == nil, len(pl), pl == nil)
		}
		for i := range pl {
			if len(pl[i]) != len(pp[i]) || (len(pl[i]) > 0 && &pl[i][0] != &pp[i][0]) {
				t.Fatalf("%s: published page %d is other memory than the loop's", what, i)
			}
		}
	}
	for i, how := range []string{"success", "decode abort", "prefill abort"} {
		key := core.RequestKey{Room: uint64(30 + i), Gen: 1}
		same(how+": new", d.NewReceiver(core.RequestKey{Room: 99}), p.NewSender(core.RequestKey{Room: 99}))
		rv, snd := openBoth(t, d, p, key, 2)
		same(how+": init", rv, snd)
		switch how {
		case "decode abort":
			rv.Abort()
			<-rv.Done()
			same(how+": failed, held", rv, snd)
		case "prefill abort":
			snd.Abort()
			<-rv.Done()
			same(how+": failed, held", rv, snd)
		default:
			sendWhole(t, snd, key, 2)
			<-rv.Done()
			<-snd.Done()
			same(how+": done", rv, snd)
			rv.Finish()
		}
		snd.Close()
		waitFor(t, how+": decode slots back", rv.Released)
		waitFor(t, how+": prefill settled", func() bool {
			var s PollState
			p.lp.call(func() { s = snd.pollInLoop() })
			return s.Final()
		})
		same(how+": released", rv, snd)
	}
}

// openBoth opens key on both sides with pages pages from prefill rank 1.
func openBoth(t *testing.T, d *Decode, p *Prefill, key core.RequestKey, pages int) (*KVReceiver, *KVSender) {
	t.Helper()
	rv, snd := d.NewReceiver(key), p.NewSender(key)
	if _, err := rv.Init(pages, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	if err := snd.Init(pages); err != nil {
		t.Fatal(err)
	}
	return rv, snd
}

// blockingCheck is oracle.Check whose first Owned (decode's verify at
// handoff, in the loop) waits for the test.
type blockingCheck struct {
	oracle.Check
	in, out chan struct{}
	once    sync.Once
}

func (c *blockingCheck) Owned(shard []byte, tag core.Tag, page int, rank core.RankID) (bool, string) {
	c.once.Do(func() { close(c.in); <-c.out })
	return c.Check.Owned(shard, tag, page, rank)
}

// A poll during the handoff never reads Success without the pages: the
// C ABI's kvfence_receiver_handoff reads them on the Success poll, and
// with Success published before them (this loop stopped in verify, in
// between) it failed the request FailedPrecondition.
func TestHandoffPublishesPagesBeforeSuccess(t *testing.T) {
	chk := &blockingCheck{in: make(chan struct{}), out: make(chan struct{})}
	d, p := startPair(t, func(c *DecodeConfig) { c.Check = chk }, nil, nil)
	key := core.RequestKey{Room: 41, Gen: 1}
	rv, snd := openBoth(t, d, p, key, 2)
	sendWhole(t, snd, key, 2)
	<-chk.in // the loop is in the handoff, between its state change and its end
	st, pages := rv.Poll(), rv.Pages()
	close(chk.out)
	if st == PollSuccess && pages == nil {
		t.Fatal("Success published before the handed-off pages")
	}
	<-rv.Done()
	if st, pages = rv.Poll(), rv.Pages(); st != PollSuccess || len(pages) != 2 {
		t.Fatalf("after handoff: %v, %d pages", st, len(pages))
	}
	rv.Finish()
	snd.Close()
}
