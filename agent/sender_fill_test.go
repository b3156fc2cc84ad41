package agent

import (
	"runtime"
	"testing"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// Fill copies in pieces of at most FillPiece bytes, each in its own turn of
// the loop: an abort queued during a piece runs before the next one, and the
// fill stops there with FailedPrecondition, writing no page after the
// request's source pages went back.
func TestFillStopsAtAbortBetweenPieces(t *testing.T) {
	const shard = FillPiece / 2 // two pages per piece
	_, p := startPair(t, func(c *DecodeConfig) { c.ShardBytes = shard }, func(c *PrefillConfig) { c.ShardBytes = shard }, nil)
	snd := p.NewSender(core.RequestKey{Room: 5, Gen: 1})
	if err := snd.Init(6); err != nil {
		t.Fatal(err)
	}
	var filled []int
	err := snd.Fill(0, 6, func(i int, page []byte) error {
		if len(page) != shard {
			t.Errorf("page %d: %d bytes, want %d", i, len(page), shard)
		}
		page[0] = byte(i + 1)
		filled = append(filled, i)
		if i == 1 {
			go snd.Abort()
			for len(p.lp.inbox) == 0 { // the abort is queued behind this piece
				runtime.Gosched()
			}
		}
		return nil
	})
	if !errdefs.IsFailedPrecondition(err) || len(filled) != 2 {
		t.Fatalf("fill across an abort: err %v, pages filled %v (want FailedPrecondition after pages [0 1])", err, filled)
	}
	if err := snd.Fill(0, 7, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("7 pages of 6: %v", err)
	}
}

// A request whose agent closed polls Failed on both sides, never the
// Bootstrapping an engine would wait on for ever.
func TestPollAfterCloseIsFailed(t *testing.T) {
	d, p := startPair(t, nil, nil, nil)
	key := core.RequestKey{Room: 6, Gen: 1}
	rv := d.NewReceiver(key)
	if _, err := rv.Init(2, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	snd := p.NewSender(key)
	d.lp.shutdown() // the loops stop as Close stops them; the cleanups Close the rest
	p.lp.shutdown()
	if rv.Poll() != PollFailed || snd.Poll() != PollFailed {
		t.Fatalf("after close: decode %v, prefill %v (want Failed, Failed)", rv.Poll(), snd.Poll())
	}
}
