package agent

import "github.com/kvfence/kvfence/errdefs"

// Write copies data (whole pages) into the source pages from page first on,
// inside the rank's event loop, and refuses (FailedPrecondition) once the
// request's source pages went back to the pool. Page hands out the memory
// itself and cannot refuse: an engine that fills a page after decode aborted
// the request and the runtime released its pages would write into another
// request's source page. Callers that cannot order their writes before the
// end of a request (the C ABI's) use Write.
func (s *KVSender) Write(first int, data []byte) error {
	shard := int(s.p.cfg.ShardBytes)
	if first < 0 || len(data)%shard != 0 || first+len(data)/shard > s.pages {
		return errdefs.Errorf(errdefs.InvalidArgument, "%d bytes at page %d: not whole pages of %d bytes within the %d reserved", len(data), first, shard, s.pages)
	}
	var err error
	if !s.p.lp.call(func() {
		r := s.p.reqs[s.key]
		if r == nil || r.snd != s || r.src == nil || r.closed {
			err = errdefs.Errorf(errdefs.FailedPrecondition, "request %d/%d ended: its source pages are no longer its own", s.key.Room, s.key.Gen)
			return
		}
		for i := 0; i < len(data)/shard; i++ {
			copy(s.Page(first+i), data[i*shard:(i+1)*shard])
		}
	}) {
		return errClosed
	}
	return err
}
