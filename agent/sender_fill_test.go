package agent

import (
	"runtime"
	"testing"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// Fill copies outside the loop, one FillPiece at a time: an Abort during a
// piece waits for that piece, and the fill stops before the next one with
// FailedPrecondition, writing no page after Abort returned.
func TestFillStopsAtAbortBetweenPieces(t *testing.T) {
	const shard = FillPiece / 2 // two pages per piece
	_, p := startPair(t, func(c *DecodeConfig) { c.ShardBytes = shard }, func(c *PrefillConfig) { c.ShardBytes = shard }, nil)
	snd := p.NewSender(core.RequestKey{Room: 5, Gen: 1})
	if err := snd.Init(6); err != nil {
		t.Fatal(err)
	}
	var filled []int
	aborted := make(chan struct{})
	err := snd.Fill(0, 6, func(i int, page []byte) error {
		if len(page) != shard {
			t.Errorf("page %d: %d bytes, want %d", i, len(page), shard)
		}
		page[0] = byte(i + 1)
		filled = append(filled, i)
		if i == 1 {
			go func() { snd.Abort(); close(aborted) }()
			for !snd.fillStop.Load() { // the loop ended the request
				runtime.Gosched()
			}
			select {
			case <-aborted:
				t.Errorf("Abort returned while page %d was being written", i)
			default:
			}
		}
		return nil
	})
	<-aborted
	if !errdefs.IsFailedPrecondition(err) || len(filled) != 2 {
		t.Fatalf("fill across an abort: err %v, pages filled %v (want FailedPrecondition after pages [0 1])", err, filled)
	}
	if err := snd.Fill(0, 7, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("7 pages of 6: %v", err)
	}
	if err := snd.Fill(0, 1, nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a fill after the abort: %v (want FailedPrecondition)", err)
	}
}

// Source pages that a request gives back while a fill of it still copies
// (outside the loop) stay out of the free list until that fill ends: no
// other request is handed a page the fill may still write. The unsafe
// variant (releaseSource freeing them at once) hands request B a page here.
func TestFillPinsReleasedSourcePages(t *testing.T) {
	const shard = FillPiece // one page per piece
	_, p := startPair(t, func(c *DecodeConfig) { c.ShardBytes = shard },
		func(c *PrefillConfig) { c.ShardBytes, c.SourcePages = shard, 4 }, nil)
	a := p.NewSender(core.RequestKey{Room: 7, Gen: 1})
	if err := a.Init(4); err != nil { // the whole pool
		t.Fatal(err)
	}
	b := p.NewSender(core.RequestKey{Room: 8, Gen: 1})
	err := a.Fill(0, 4, func(i int, page []byte) error {
		if i > 0 {
			t.Errorf("page %d written after the request ended", i)
			return nil
		}
		go a.Abort() // never linked to decode: the core releases A's pages at once
		for !a.fillStop.Load() {
			runtime.Gosched()
		}
		if err := b.Init(1); !errdefs.IsResourceExhausted(err) {
			t.Errorf("B reserved a source page while A's fill still wrote its pages: %v (want ResourceExhausted)", err)
		}
		page[0] = 1
		return nil
	})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("fill across the release: %v (want FailedPrecondition)", err)
	}
	if err := b.Init(4); err != nil {
		t.Fatalf("after the fill ended, A's pages are free again: %v", err)
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

// A Write (the aux row of SGLang's last send()) copies while another fill
// of the same request is inside a step (the C ABI's gather job copying the
// earlier chunks): fills of different pages share the fence. With a plain
// mutex the Write waited for the fill to let go between steps (and Go's
// mutex hands it over only after 1 ms of starvation): here the fill waits
// for the Write, so that variant never ends this test.
func TestWriteCopiesWhileAFillIsInAStep(t *testing.T) {
	_, p := startPair(t, nil, nil, nil)
	snd := p.NewSender(core.RequestKey{Room: 9, Gen: 1})
	if err := snd.Init(2); err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	err := snd.Fill(0, 1, func(i int, page []byte) error {
		go func() { wrote <- snd.Write(1, make([]byte, len(page))) }()
		return <-wrote // inside the fill's step
	})
	if err != nil {
		t.Fatalf("a Write during a fill's step: %v", err)
	}
	// Abort still waits for the step in progress, and a Write after it
	// is refused.
	aborted := make(chan struct{})
	err = snd.Fill(0, 1, func(i int, page []byte) error {
		go func() { snd.Abort(); close(aborted) }()
		for !snd.fillStop.Load() {
			runtime.Gosched()
		}
		return nil
	})
	<-aborted
	if err != nil {
		t.Fatalf("a step begun before the abort: %v", err)
	}
	if err := snd.Write(1, make([]byte, len(snd.Page(1)))); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a Write after the abort: %v (want FailedPrecondition)", err)
	}
}
