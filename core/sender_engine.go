package core

import "github.com/kvfence/kvfence/errdefs"

// This file: the prefill engine's calls into a Sender.

// Open starts a request on this rank: the engine will produce up to pages
// pages. Assigns for it (already received or still to come) bind to it.
func (s *Sender) Open(key RequestKey, pages int, now Time) error {
	s.out.reset()
	if pages <= 0 || pages > MaxWireSlots {
		return errorf(errdefs.InvalidArgument, "request %s: pages %d out of range", key, pages)
	}
	rec := s.recs.get(key)
	if rec != nil && rec.req != nil {
		return errorf(errdefs.AlreadyExists, "request %s is already open", key)
	}
	if rec != nil && rec.ended {
		return errorf(errdefs.FailedPrecondition, "request %s already ended here; use a new generation", key)
	}
	req := s.newRequest()
	req.key, req.pages, req.openedAt, req.idx = key, uint32(pages), now, len(s.reqList)
	rec = s.recFor(key)
	rec.req = req
	s.reqList = append(s.reqList, req)
	s.bootTimers.schedule(req, now.Add(s.cfg.BootstrapTimeout))
	for _, st := range rec.waiting {
		s.bind(st, req)
	}
	clear(rec.waiting)
	rec.waiting = rec.waiting[:0]
	s.pump(now)
	return nil
}

// Produce marks pages [0, upto) of a request as computed and sendable.
func (s *Sender) Produce(key RequestKey, upto int, now Time) error {
	s.out.reset()
	req := s.request(key)
	if req == nil {
		return errorf(errdefs.NotFound, "request %s is not open", key)
	}
	if upto < 0 || uint32(upto) > req.pages {
		return errorf(errdefs.InvalidArgument, "request %s: page %d beyond its %d pages", key, upto, req.pages)
	}
	if uint32(upto) > req.ready {
		req.ready = uint32(upto)
		for _, st := range req.streams {
			s.enqueue(st)
		}
	}
	s.pump(now)
	return nil
}

// Finish says the request produced its last page: total pages in all
// (fewer than opened means it was cut short; decode will refuse it).
func (s *Sender) Finish(key RequestKey, total int, now Time) error {
	s.out.reset()
	req := s.request(key)
	if req == nil {
		return errorf(errdefs.NotFound, "request %s is not open", key)
	}
	if total < 0 || uint32(total) > req.pages {
		return errorf(errdefs.InvalidArgument, "request %s: total %d beyond its %d pages", key, total, req.pages)
	}
	req.finished = true
	req.total = uint32(total)
	if req.ready < req.total {
		req.ready = req.total
	}
	for _, st := range req.streams {
		s.enqueue(st)
	}
	s.pump(now)
	for _, st := range s.snapshot(req) {
		s.maybeCommit(st)
	}
	return nil
}

// Reject refuses a request on prefill (over capacity, too long): every
// decode rank is told with Fail, and the request never hands off.
func (s *Sender) Reject(key RequestKey, now Time) error {
	s.out.reset()
	req := s.request(key)
	if req == nil {
		return errorf(errdefs.NotFound, "request %s is not open", key)
	}
	req.rejected = true
	s.endRequest(req, now)
	for _, st := range s.snapshot(req) {
		if st.state == StreamSending {
			s.fail(st, ReasonRejected)
			s.maybeAck(st)
		}
	}
	s.settleRequest(req)
	return nil
}

// Abort cancels a request on prefill (the router cancels prefill and
// decode together): unsent pages are dropped, in-flight work drains.
func (s *Sender) Abort(key RequestKey, now Time) error {
	s.out.reset()
	req := s.request(key)
	if req == nil {
		// Abort before Open: refuse the request's Assigns from now on, and
		// drain those that already arrived.
		if !s.requestEnded(key) {
			s.tombstoneRequest(key, now)
		}
		if rec := s.recs.get(key); rec != nil {
			for _, st := range append(s.scratch[:0], rec.waiting...) {
				s.drain(st)
			}
		}
		return nil
	}
	s.cancel(req, ReasonClientAbort, now)
	return nil
}

// Close is the engine dropping its request object. Holds do not go with it:
// unfinished streams drain, and the source pages come back only through a
// SourceRelease.
func (s *Sender) Close(key RequestKey, now Time) error {
	s.out.reset()
	req := s.request(key)
	if req == nil {
		return errorf(errdefs.NotFound, "request %s is not open", key)
	}
	req.closed = true
	s.endRequest(req, now)
	for _, st := range s.snapshot(req) {
		if st.state == StreamSending {
			s.drain(st)
		}
	}
	s.settleRequest(req)
	return nil
}

// cancel ends a request on this rank: every stream drains, and the engine
// is told once.
func (s *Sender) cancel(req *request, reason Reason, now Time) {
	s.endRequest(req, now)
	s.tellFailed(req, reason)
	for _, st := range s.snapshot(req) {
		s.drain(st)
	}
	s.settleRequest(req)
}

// snapshot copies a request's live streams into scratch space, for loops
// whose steps may turn streams into tombstones.
func (s *Sender) snapshot(req *request) []*stream {
	s.scratch = append(s.scratch[:0], req.streams...)
	return s.scratch
}

func (s *Sender) tellFailed(req *request, reason Reason) {
	if !req.failed {
		req.failed = true
		s.out.Failures = append(s.out.Failures, Failure{Tag: Tag{Room: req.key.Room, Gen: req.key.Gen}, Reason: reason})
	}
}

func (s *Sender) endRequest(req *request, now Time) {
	if !req.ended {
		req.ended = true
		s.tombstoneRequest(req.key, now)
	}
}

func (s *Sender) tombstoneRequest(key RequestKey, now Time) {
	if !s.policy.KeepTombstones() {
		return
	}
	until := now.Add(s.cfg.RequestTombstone)
	rec := s.recFor(key)
	rec.ended, rec.endUntil = true, until
	s.reqTombTimers.push(until, key)
}

// settleRequest gives the source pages back once the engine is done with
// the request and none of its streams can still read them (I7). Streams that
// finished are tombstones by then and no longer listed.
func (s *Sender) settleRequest(req *request) {
	rec := s.recs.get(req.key)
	if !req.ended || len(req.streams) > 0 || rec == nil || rec.req != req {
		return
	}
	rec.req = nil
	s.tidy(req.key, rec)
	s.bootTimers.remove(req)
	last := s.reqList[len(s.reqList)-1]
	s.reqList[req.idx] = last
	last.idx = req.idx
	s.reqList = s.reqList[:len(s.reqList)-1]
	s.out.SourceReleases = append(s.out.SourceReleases, SourceRelease{Key: req.key})
	req.streams = req.streams[:0]
	s.freeReqs = append(s.freeReqs, req)
}

func (s *Sender) newRequest() *request {
	if n := len(s.freeReqs); n > 0 {
		req := s.freeReqs[n-1]
		s.freeReqs = s.freeReqs[:n-1]
		*req = request{streams: req.streams[:0]}
		return req
	}
	return &request{}
}
