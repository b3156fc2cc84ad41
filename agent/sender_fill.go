package agent

import "github.com/kvfence/kvfence/errdefs"

// FillPiece is the most bytes FillPieces hands its callback at once: the
// request's end is checked before each piece, and an Abort or Close waits
// for at most the piece being copied.
const FillPiece = 256 << 10

// Fill has fill write source pages [first, first+count) (fill(i, page) for
// each page i). It is FillPieces one page at a time.
func (s *KVSender) Fill(first, count int, fill func(i int, page []byte) error) error {
	return s.FillPieces(first, count, func(at int, pages [][]byte) error {
		for k, page := range pages {
			if err := fill(at+k, page); err != nil {
				return err
			}
		}
		return nil
	})
}

// FillPieces has fill write source pages [first, first+count), handing it
// consecutive pieces (pages [at, at+len(pages)), at most FillPiece bytes,
// at least one page). It is FillRange with a step before each piece.
func (s *KVSender) FillPieces(first, count int, fill func(at int, pages [][]byte) error) error {
	per := max(1, FillPiece/int(s.p.cfg.ShardBytes))
	return s.FillRange(first, count, func(pages [][]byte, step func() error) error {
		for at := 0; at < len(pages); at += per {
			if err := step(); err != nil {
				return err
			}
			if err := fill(first+at, pages[at:min(at+per, len(pages))]); err != nil {
				return err
			}
		}
		return nil
	})
}

// FillRange hands fill source pages [first, first+count) at once, on the
// calling goroutine, outside the rank's loop, for a copy that orders its
// work across pages (stage.GatherPages). fill copies in steps of at most
// FillPiece bytes and calls step before each one, the first included; once
// step fails (FailedPrecondition: the request ended) fill must write no
// more and return that error. An error from fill is returned.
//
// Why outside the loop: a copy in the loop cost a round trip to it per
// piece and made every poll, ack and engine call wait behind the copy; a
// turn of the loop on a loaded host is also what made the last send() of a
// request slow (its aux row's Write). The fill pins the request's source
// pages instead, without the loop (preReq.pins): pages that the request
// gives back while any pin holds (abort, close, failure) stay out of the
// free list until the last pin goes, so no other request is handed a page
// this fill may still write. step checks that the request has not ended
// (Abort, Close, the pages released, the agent closed), and read-holds
// fillMu until the next step or the end: Abort and Close return only after
// every step being copied ended, so nothing is written after them. A read
// lock, because fills of one request may run at once (the C ABI's gather
// job and the last send()'s aux row Write): with a plain mutex the Write
// waited for the gather's copy to let go between two 256 KiB steps, which
// Go's mutex does not grant a waiter before 1 ms of starvation (the last
// send() took 0.1-1.9 ms, docs/sglang.md). Abort's write lock still goes
// first: a pending writer holds back new readers.
func (s *KVSender) FillRange(first, count int, fill func(pages [][]byte, step func() error) error) error {
	if first < 0 || count < 0 || first+count > s.pages {
		return errdefs.Errorf(errdefs.InvalidArgument, "pages [%d, %d) of the %d reserved", first, first+count, s.pages)
	}
	if count == 0 {
		return nil
	}
	if s.p.lp.stopped() {
		return errClosed
	}
	r := s.req
	if r == nil || !r.pin() {
		return errEnded(s)
	}
	defer s.p.unpin(r)
	pages := make([][]byte, count)
	for i := range pages {
		pages[i] = s.Page(first + i)
	}
	held := false
	defer func() {
		if held {
			s.fillMu.RUnlock()
		}
	}()
	return fill(pages, func() error {
		if held { // a waiting Abort or Close goes in between steps
			s.fillMu.RUnlock()
		}
		s.fillMu.RLock()
		held = true
		if s.fillStop.Load() || s.p.lp.stopped() || r.pins.Load()&pinReleased != 0 {
			return errEnded(s)
		}
		return nil
	})
}

// pinReleased is set in preReq.pins once the loop released the request's
// source pages; the bits below it count pins.
const pinReleased = 1 << 62

// pin counts a fill on r's source pages, unless the loop released them.
func (r *preReq) pin() bool {
	for {
		v := r.pins.Load()
		if v&pinReleased != 0 {
			return false
		}
		if r.pins.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// unpin ends a pin; the last one after the loop released r's pages gives
// them back to the free list (through the loop, which owns it).
func (p *Prefill) unpin(r *preReq) {
	if r.pins.Add(-1) == pinReleased {
		pages := r.unfreed // stored by the loop before it set pinReleased
		p.lp.post(func() { p.free = append(p.free, pages...) })
	}
}

// releasePinned marks r's source pages released (loop only) and reports
// whether the loop may free them now; else the last pin frees them.
func (r *preReq) releasePinned() bool {
	r.unfreed = r.src
	if r.pins.Or(pinReleased) == 0 {
		return true
	}
	r.snd.fillStop.Store(true)
	return false
}

// stopFills makes s's fills stop before their next step and waits for the
// steps being copied, if any. Abort and Close call it after the loop ended
// the request (not from a fill's callback: fillMu is held there).
func (s *KVSender) stopFills() {
	s.fillStop.Store(true)
	s.fillMu.Lock()
	s.fillMu.Unlock() //nolint:staticcheck // an empty section: waits for the step in progress
}

func errEnded(s *KVSender) error {
	return errdefs.Errorf(errdefs.FailedPrecondition, "request %d/%d ended: its source pages are no longer its own", s.key.Room, s.key.Gen)
}
