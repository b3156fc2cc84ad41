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
// piece and made every poll, ack and engine call wait behind the copy. The
// loop instead pins the request's source pages once: while any fill of the
// request runs, pages that the request gives back (abort, close, failure)
// stay out of the free list, so no other request is handed a page this
// fill may still write. step checks that the request has not ended (Abort,
// Close, the pages released, the agent closed), and holds fillMu until the
// next step or the end: Abort and Close return only after the step being
// copied ended, so nothing is written after them.
func (s *KVSender) FillRange(first, count int, fill func(pages [][]byte, step func() error) error) error {
	if first < 0 || count < 0 || first+count > s.pages {
		return errdefs.Errorf(errdefs.InvalidArgument, "pages [%d, %d) of the %d reserved", first, first+count, s.pages)
	}
	if count == 0 {
		return nil
	}
	r, err := s.pinFill()
	if err != nil {
		return err
	}
	defer s.p.lp.call(func() { s.p.unpinFill(r) })
	pages := make([][]byte, count)
	for i := range pages {
		pages[i] = s.Page(first + i)
	}
	held := false
	defer func() {
		if held {
			s.fillMu.Unlock()
		}
	}()
	return fill(pages, func() error {
		if held { // a waiting Abort or Close goes in between steps
			s.fillMu.Unlock()
		}
		s.fillMu.Lock()
		held = true
		if s.fillStop.Load() || s.p.lp.stopped() {
			return errEnded(s)
		}
		return nil
	})
}

// pinFill checks in the loop that the request still owns its source pages
// and counts a fill on them (unpinFill ends it).
func (s *KVSender) pinFill() (*preReq, error) {
	var r *preReq
	if !s.p.lp.call(func() {
		if q := s.p.reqs[s.key]; q != nil && q.snd == s && q.src != nil && !q.closed {
			q.fills++
			r = q
		}
	}) {
		return nil, errClosed
	}
	if r == nil {
		return nil, errEnded(s)
	}
	return r, nil
}

// unpinFill ends one fill of r; the last one gives back pages that r
// released meanwhile (loop only).
func (p *Prefill) unpinFill(r *preReq) {
	r.fills--
	if r.fills == 0 && r.unfreed != nil {
		p.free = append(p.free, r.unfreed...)
		r.unfreed = nil
	}
}

// stopFills makes s's fills stop before their next piece and waits for the
// piece being copied, if any (not in the loop: a fill takes the loop to
// unpin). Abort and Close call it after the loop ended the request.
func (s *KVSender) stopFills() {
	s.fillStop.Store(true)
	s.fillMu.Lock()
	s.fillMu.Unlock() //nolint:staticcheck // an empty section: waits for the piece in progress
}

func errEnded(s *KVSender) error {
	return errdefs.Errorf(errdefs.FailedPrecondition, "request %d/%d ended: its source pages are no longer its own", s.key.Room, s.key.Gen)
}
