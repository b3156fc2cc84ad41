package agent

import "github.com/kvfence/kvfence/errdefs"

// FillPiece is the most bytes Fill copies in one turn of the rank's loop:
// other inputs (polls, acks, the transport's completions) wait at most one
// piece (tens of microseconds), never a whole request.
const FillPiece = 256 << 10

// Fill has fill write source pages [first, first+count) (fill(i, page) for
// each page i), in pieces of at most FillPiece bytes. Each piece runs in the
// rank's loop after checking that the request still owns its source pages,
// so a page that went back to the pool (abort, close, failure) is never
// written; the request ending between pieces stops the fill with
// FailedPrecondition. An error from fill stops it too and is returned.
func (s *KVSender) Fill(first, count int, fill func(i int, page []byte) error) error {
	if first < 0 || count < 0 || first+count > s.pages {
		return errdefs.Errorf(errdefs.InvalidArgument, "pages [%d, %d) of the %d reserved", first, first+count, s.pages)
	}
	per := max(1, FillPiece/int(s.p.cfg.ShardBytes))
	for at := first; at < first+count; at += per {
		end := min(at+per, first+count)
		var err error
		if !s.p.lp.call(func() { err = s.fillPiece(at, end, fill) }) {
			return errClosed
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// fillPiece writes pages [at, end) (loop only).
func (s *KVSender) fillPiece(at, end int, fill func(int, []byte) error) error {
	r := s.p.reqs[s.key]
	if r == nil || r.snd != s || r.src == nil || r.closed {
		return errdefs.Errorf(errdefs.FailedPrecondition, "request %d/%d ended: its source pages are no longer its own", s.key.Room, s.key.Gen)
	}
	for i := at; i < end; i++ {
		if err := fill(i, s.Page(i)); err != nil {
			return err
		}
	}
	return nil
}
