package core

// This file: control messages from decode, and the life of one stream
// (tag, decode rank) from Assign to its tombstone.

// Step applies one control message from a decode rank (or the router).
func (s *Sender) Step(m Message, now Time) {
	s.out.reset()
	if m.Rank != s.cfg.Rank {
		s.metrics.StaleMessages++
		return
	}
	key := streamKey{m.Tag, m.Decode}
	st := s.stream(key)
	switch m.Kind {
	case KindAssign:
		s.onAssign(key, st, m, now)
	case KindGrant:
		// Only a live lease grows; a lapsed one is never renewed.
		if st != nil && (st.state == StreamSending || st.state == StreamWaiting) &&
			now < s.streamLease(st).Add(-s.cfg.SkewMargin) && m.LeaseUntil > st.lease {
			st.lease = m.LeaseUntil
			s.enqueue(st)
		}
	case KindLease:
		s.onLease(m)
		s.pump(now)
		return
	case KindAbort, KindReject:
		s.onAbort(key, st, m, now)
	default:
		s.metrics.StaleMessages++
	}
	if st := s.stream(key); st != nil && st.req != nil {
		s.settleRequest(st.req)
	} else if req := s.request(m.Tag.Key()); req != nil {
		s.settleRequest(req)
	}
	s.pump(now)
}

func (s *Sender) onAssign(key streamKey, st *stream, m Message, now Time) {
	if _, dead := s.tomb(key); st != nil || dead {
		s.metrics.DuplicateAssigns++ // a live stream or a tombstone: never restart writes
		return
	}
	if len(m.Slots) == 0 {
		s.metrics.StaleMessages++ // an Assign with nothing to write is malformed
		return
	}
	if now >= m.LeaseUntil.Add(-s.cfg.SkewMargin) {
		// A late or duplicated Assign whose lease has passed is refused.
		s.metrics.RefusedAssigns++
		s.metrics.Fails++
		s.sendTo(key, Message{Kind: KindFail, Reason: ReasonLeaseLapsed})
		s.ackUnknown(key, m.LeaseUntil)
		return
	}
	req := s.request(key.tag.Key())
	if s.requestEnded(key.tag.Key()) || (req != nil && req.ended) {
		// The request already ended here (abort before assign): nothing
		// will ever be posted for it.
		s.metrics.RefusedAssigns++
		s.ackUnknown(key, m.LeaseUntil)
		return
	}
	// Assign leases are near-term timers; covered streams wait far, at HoldUntil.
	s.leaseTimers.widen(m.LeaseUntil.Sub(now))
	st = s.newStream(key, m.LeaseUntil, m.HoldUntil)
	st.slots = append(st.slots[:0], m.Slots...)
	if req != nil {
		s.bind(st, req)
		return
	}
	rec := s.recFor(key.tag.Key())
	rec.waiting = append(rec.waiting, st)
}

func (s *Sender) onAbort(key streamKey, st *stream, m Message, now Time) {
	// One decode rank giving up dooms the request everywhere (the router
	// needs every rank): end it here too, so its source pages come back
	// even if the router's own cancel is lost.
	if req := s.request(key.tag.Key()); req != nil && !req.ended {
		reason := m.Reason
		if reason == ReasonNone {
			reason = ReasonDecodeAbort
		}
		wasLive := st != nil
		s.cancel(req, reason, now) // drains st too
		if st = s.stream(key); st == nil && wasLive {
			return // it drained at once and acknowledged
		}
	}
	if st != nil {
		s.drain(st)
		return
	}
	if tb, ok := s.tomb(key); ok {
		// Decode may have lost the first DrainAck; a Commit is a drain too.
		s.ackKey(key, tb.evidence)
		return
	}
	// Abort overtook its Assign (or the stream is long gone): answer with
	// DrainAck and keep a tombstone until the tag's lease is over.
	s.ackUnknown(key, m.LeaseUntil)
}

// ackUnknown answers for a tag this rank never posted for, and keeps a
// tombstone so that its Assign, if it still comes, starts nothing.
func (s *Sender) ackUnknown(key streamKey, lease Time) {
	s.ackKey(key, EvidenceNothingPosted)
	s.addTomb(key, lease, StreamAcked, EvidenceNothingPosted)
}

func (s *Sender) addTomb(key streamKey, lease Time, state StreamState, ev DrainEvidence) {
	if !s.policy.KeepTombstones() {
		return
	}
	until := lease.Add(s.cfg.SkewMargin)
	s.setTomb(key, tombstone{until: until, state: state, evidence: ev})
	s.tombTimers.push(until, key)
}

func (s *Sender) newStream(key streamKey, lease, holdUntil Time) *stream {
	var st *stream
	if n := len(s.freeStreams); n > 0 {
		st = s.freeStreams[n-1]
		s.freeStreams = s.freeStreams[:n-1]
		*st = stream{slots: st.slots[:0], batches: st.batches[:0]}
	} else {
		st = &stream{}
	}
	st.key, st.state, st.lease = key, StreamWaiting, lease
	// An Assign without a hold bound gets no rank lease beyond its own.
	st.holdUntil = lease
	if holdUntil > lease {
		st.holdUntil = holdUntil
	}
	s.listStream(st)
	st.idx = len(s.list)
	s.list = append(s.list, st)
	s.addStream(st)
	// Grants only move the lease later: the entry is early, never late.
	s.leaseTimers.schedule(st, lease.Add(-s.cfg.SkewMargin))
	return st
}

func (s *Sender) bind(st *stream, req *request) {
	st.req = req
	st.state = StreamSending
	req.streams = append(req.streams, st)
	s.enqueue(st)
}

// unwait forgets a stream that was waiting for its request to open.
func (s *Sender) unwait(st *stream) {
	if st.req != nil {
		return
	}
	k := st.key.tag.Key()
	if rec := s.recs.get(k); rec != nil {
		rec.waiting = without(rec.waiting, st)
		s.tidy(k, rec)
	}
}

func (s *Sender) failIfSending(st *stream, reason Reason) {
	if st.state == StreamSending || st.state == StreamWaiting {
		s.fail(st, reason)
	}
}

// fail sends Fail (never counted as completion by decode) and quiesces
// everything of the stream that may still move.
func (s *Sender) fail(st *stream, reason Reason) {
	s.unwait(st)
	s.unlistStream(st)
	st.state = StreamFailed
	s.metrics.Fails++
	if st.req != nil {
		s.tellFailed(st.req, reason)
	}
	s.dropUnsent(st)
	s.send(st, Message{Kind: KindFail, Reason: reason})
	s.quiesceAll(st)
}

func (s *Sender) drain(st *stream) {
	s.unwait(st)
	s.unlistStream(st)
	if st.state != StreamDraining {
		st.state = StreamDraining
		s.dropUnsent(st)
	}
	s.maybeAck(st)
}

func (s *Sender) dropUnsent(st *stream) {
	if n := uint32(len(st.slots)); st.posted < n {
		s.metrics.DroppedPages += uint64(n - st.posted)
		st.posted = n // nothing more will be posted
	}
}

func (s *Sender) quiesceAll(st *stream) {
	if !s.policy.WaitForInDoubt() {
		return
	}
	var ids []BatchID
	for _, b := range st.batches {
		if !b.settled && !b.asked {
			b.asked = true
			ids = append(ids, b.id)
		}
	}
	if len(ids) > 0 {
		s.out.Quiesces = append(s.out.Quiesces, Quiesce{Decode: st.key.decode, Batches: ids})
	}
}

func (s *Sender) maybeCommit(st *stream) {
	if st.state != StreamSending || st.req == nil || !st.req.finished || st.unsettled > 0 || !s.donePosting(st) {
		return
	}
	s.unlistStream(st)
	s.metrics.Commits++
	s.send(st, Message{Kind: KindCommit, Coverage: st.succeeded})
	s.out.Sent = append(s.out.Sent, Sent{Key: st.req.key, Decode: st.key.decode})
	st.state = StreamCommitted
	s.entomb(st, EvidenceCompleted)
}

// maybeAck sends DrainAck once nothing of the stream can still move (I5).
func (s *Sender) maybeAck(st *stream) {
	if (st.state != StreamFailed && st.state != StreamDraining) || st.unsettled > 0 {
		return
	}
	if s.policy.WaitForInDoubt() {
		for _, b := range st.batches {
			if !b.settled {
				return
			}
		}
	}
	ev := EvidenceCompleted
	switch {
	case !st.everPosted:
		ev = EvidenceNothingPosted
	case st.anyQuiesced:
		ev = EvidenceQuiesced
	}
	s.ackKey(st.key, ev)
	st.state = StreamAcked
	s.entomb(st, ev)
}

func (s *Sender) ackKey(key streamKey, ev DrainEvidence) {
	s.metrics.DrainAcks++
	s.sendTo(key, Message{Kind: KindDrainAck, Evidence: ev})
}

// entomb turns a finished stream into a tombstone that lasts until its lease
// is over, so a duplicated or late Assign never restarts writes, and reuses
// the stream's memory.
func (s *Sender) entomb(st *stream, ev DrainEvidence) {
	s.unlistStream(st)
	st.peer.unsettled -= st.unsettled // its batches' completions no longer count
	s.addTomb(st.key, st.lease, st.state, ev)
	s.removeStream(st)
	s.leaseTimers.remove(st)
	last := s.list[len(s.list)-1]
	s.list[st.idx] = last
	last.idx = st.idx
	s.list = s.list[:len(s.list)-1]
	if req := st.req; req != nil {
		for i, x := range req.streams {
			if x == st {
				req.streams = append(req.streams[:i], req.streams[i+1:]...)
				break
			}
		}
		if len(req.streams) == 0 && !req.ended {
			// No stream left: the bootstrap timeout applies again.
			s.bootTimers.schedule(req, req.openedAt.Add(s.cfg.BootstrapTimeout))
		}
	}
	for _, b := range st.batches {
		b.st = nil // settled, its completion still to come
	}
	if st.queued {
		// Still referenced by the run queue: pump skips it (not Sending);
		// it is reused once it leaves the queue.
		st.state = StreamAcked
		st.req = nil
		return
	}
	s.freeStreams = append(s.freeStreams, st)
}

func (s *Sender) donePosting(st *stream) bool {
	want := st.req.total
	if n := uint32(len(st.slots)); want > n {
		want = n
	}
	return st.posted >= want
}

func (s *Sender) send(st *stream, m Message) { s.sendTo(st.key, m) }

func (s *Sender) sendTo(key streamKey, m Message) {
	m.Tag = key.tag
	m.Rank = s.cfg.Rank
	m.Decode = key.decode
	s.out.Messages = append(s.out.Messages, Envelope{To: key.decode, Msg: m})
}
