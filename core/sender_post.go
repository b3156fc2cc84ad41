package core

import (
	"slices"

	"github.com/kvfence/kvfence/errdefs"
)

// This file: posting batches, their completions and quiescence, and the
// rank's timers.

// Completed takes a batch's one terminal completion. Anything but Succeeded
// is not completion: the stream fails, and an in-doubt batch must be
// quiesced before the rank may ever say DrainAck.
func (s *Sender) Completed(id BatchID, status BatchStatus, now Time) error {
	s.out.reset()
	b := s.batches[id]
	if b == nil {
		return errorf(errdefs.NotFound, "batch %d is unknown", id)
	}
	if b.done {
		return errorf(errdefs.FailedPrecondition, "batch %d already completed", id)
	}
	if status < Succeeded || status > InDoubt {
		return errorf(errdefs.InvalidArgument, "batch %d: status %d", id, status)
	}
	b.done = true
	b.status = status
	switch status {
	case Succeeded:
		s.metrics.Succeeded++
	case FailedDefinite:
		s.metrics.FailedDefinite++
	case InDoubt:
		s.metrics.InDoubt++
	}
	st := b.st
	if st == nil { // its stream is a tombstone: the batch was quiesced
		s.forget(b)
		return nil
	}
	switch status {
	case Succeeded:
		st.succeeded += b.pages
		s.settle(b)
	case FailedDefinite:
		s.settle(b)
		s.failIfSending(st, ReasonSendFailed)
	case InDoubt:
		if !s.policy.WaitForInDoubt() {
			s.settle(b) // an error taken as "it stopped"
		}
		s.failIfSending(st, ReasonSendFailed) // quiesces the whole stream
		if !b.settled && !b.asked {
			b.asked = true
			s.out.Quiesces = append(s.out.Quiesces, Quiesce{Decode: st.key.decode, Batches: []BatchID{b.id}})
		}
	}
	req := st.req
	s.forget(b)
	s.maybeCommit(st)
	s.maybeAck(st)
	if req != nil {
		s.settleRequest(req)
	}
	s.pump(now)
	return nil
}

// Quiesced takes the transport's evidence that these batches can no longer
// move bytes.
func (s *Sender) Quiesced(ids []BatchID, ev DrainEvidence, now Time) {
	s.out.reset()
	for _, id := range ids {
		b := s.batches[id]
		if b == nil || b.settled {
			continue
		}
		b.quiesced = true
		s.metrics.Quiesced++
		st := b.st
		s.settle(b)
		s.forget(b)
		if st != nil {
			st.anyQuiesced = true
			req := st.req
			s.maybeAck(st)
			if req != nil {
				s.settleRequest(req)
			}
		}
	}
	s.pump(now)
}

func (s *Sender) settle(b *batch) {
	if b.settled {
		return
	}
	b.settled = true
	s.unsettled--
	if b.st != nil {
		b.st.unsettled--
		b.st.peer.unsettled--
	}
}

// forget drops a batch once it is both completed and settled, and reuses it.
func (s *Sender) forget(b *batch) {
	if !b.done || !b.settled {
		return
	}
	delete(s.batches, b.id)
	if st := b.st; st != nil {
		bs := st.batches
		for i, x := range bs {
			if x == b {
				bs[i] = bs[len(bs)-1]
				st.batches = bs[:len(bs)-1]
				break
			}
		}
	}
	*b = batch{}
	s.freeBatches = append(s.freeBatches, b)
}

// Tick advances the rank's timers: lapsed leases stop their streams,
// requests no decode ever assigned end, heartbeats go out, tombstones
// expire.
func (s *Sender) Tick(now Time) {
	s.out.reset()
	// Only timers that are due; each is checked against the current state
	// (an entry may be early or stale) and visited in list order, as a walk
	// of every stream and request would.
	s.lapseTimers(now)
	s.tickLeases(now)
	s.tickBootstraps(now)
	s.tickTombstones(now)
	if !s.hbStarted || now.Sub(s.lastHB) >= s.cfg.Heartbeat {
		s.hbStarted = true
		s.lastHB = now
		s.heartbeats(now)
	}
	s.pump(now)
}

// tickLeases stops the streams whose lease (less the skew margin) has
// lapsed, in stream order.
func (s *Sender) tickLeases(now Time) {
	due := s.leaseTimers.popDue(now, s.dueStreams[:0])
	slices.SortFunc(due, func(a, b *stream) int { return a.idx - b.idx })
	for _, st := range due {
		if s.stream(st.key) != st || (st.state != StreamWaiting && st.state != StreamSending) {
			continue // it ended by an input: only inputs act on it now
		}
		if lapse := s.streamLease(st).Add(-s.cfg.SkewMargin); now < lapse {
			s.leaseTimers.schedule(st, s.leaseDue(st)) // a Grant or a Lease moved it
			continue
		}
		if st.req != nil && st.req.finished && s.donePosting(st) {
			continue // everything posted: it ends by its completions, never by its lease
		}
		s.metrics.LeaseLapses++
		req := st.req
		s.fail(st, ReasonLeaseLapsed)
		s.maybeAck(st)
		if req != nil {
			s.settleRequest(req)
		}
	}
	clear(due)
	s.dueStreams = due[:0]
}

// tickBootstraps cancels the requests no decode assigned within
// BootstrapTimeout, in request order.
func (s *Sender) tickBootstraps(now Time) {
	reqs := s.bootTimers.popDue(now, s.dueReqs[:0])
	slices.SortFunc(reqs, func(a, b *request) int { return a.idx - b.idx })
	for _, req := range reqs {
		if s.request(req.key) != req || req.ended || len(req.streams) > 0 {
			continue // assigned (entomb queues it again if its streams end) or ended
		}
		if deadline := req.openedAt.Add(s.cfg.BootstrapTimeout); now < deadline {
			s.bootTimers.schedule(req, deadline)
			continue
		}
		s.cancel(req, ReasonBootstrapTimeout, now)
	}
	clear(reqs)
	s.dueReqs = reqs[:0]
}

// tickTombstones forgets the tag and request tombstones that expired.
// Deletes only: their order cannot change any output.
func (s *Sender) tickTombstones(now Time) {
	for {
		k, ok := s.tombTimers.popDue(now)
		if !ok {
			break
		}
		s.expireTomb(k, now)
	}
	for {
		k, ok := s.reqTombTimers.popDue(now)
		if !ok {
			break
		}
		s.expireRequestTomb(k, now)
	}
}

// pump posts what may be posted: round robin over queued streams, one batch
// each per turn, within the rank's in-flight bound and each stream's lease.
func (s *Sender) pump(now Time) {
	for s.runHead < len(s.runq) && s.unsettled < s.cfg.MaxInflight {
		st := s.runq[s.runHead]
		s.runq[s.runHead] = nil
		s.runHead++
		st.queued = false
		if st.state == StreamCommitted || st.state == StreamAcked {
			s.freeStreams = append(s.freeStreams, st) // a tombstone's leftover
			continue
		}
		if n := s.sendable(st, now); n > 0 {
			s.post(st, n)
			s.enqueue(st) // round robin: back of the queue
		}
	}
	if s.runHead == len(s.runq) {
		s.runq, s.runHead = s.runq[:0], 0
	} else if s.runHead > 1024 && s.runHead*2 > len(s.runq) {
		n := copy(s.runq, s.runq[s.runHead:])
		s.runq, s.runHead = s.runq[:n], 0
	}
}

// enqueue marks a stream as possibly having pages to post. pump looks only
// at queued streams, so an input costs the same with 10 or 100,000 streams.
func (s *Sender) enqueue(st *stream) {
	if !st.queued && st.state == StreamSending {
		st.queued = true
		s.runq = append(s.runq, st)
	}
}

// sendable is how many pages the stream may post now, in one batch.
func (s *Sender) sendable(st *stream, now Time) uint32 {
	if st.state != StreamSending || now >= s.streamLease(st).Add(-s.cfg.SkewMargin) {
		return 0
	}
	limit := st.req.ready
	if n := uint32(len(st.slots)); limit > n {
		limit = n
	}
	if st.req.finished && limit > st.req.total {
		limit = st.req.total
	}
	if st.posted >= limit {
		return 0
	}
	n := limit - st.posted
	if n > uint32(s.cfg.MaxBatchPages) {
		n = uint32(s.cfg.MaxBatchPages)
	}
	return n
}

func (s *Sender) post(st *stream, n uint32) {
	s.nextBatch++
	var b *batch
	if k := len(s.freeBatches); k > 0 {
		b = s.freeBatches[k-1]
		s.freeBatches = s.freeBatches[:k-1]
	} else {
		b = &batch{}
	}
	b.id, b.st, b.pages = s.nextBatch, st, n
	s.batches[b.id] = b
	st.batches = append(st.batches, b)
	st.unsettled++
	st.peer.unsettled++
	s.unsettled++
	st.everPosted = true
	s.metrics.Posted++
	s.out.Posts = append(s.out.Posts, Post{
		Batch: b.id, Tag: st.key.tag, Decode: st.key.decode,
		FirstPage: st.posted, Slots: st.slots[st.posted : st.posted+n],
	})
	st.posted += n
}
