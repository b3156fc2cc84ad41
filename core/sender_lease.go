package core

// This file: the rank's side of the heartbeat and the rank lease
// (docs/design.md §3, Heartbeats and the rank lease). A heartbeat carries
// what changed since decode last answered, never the whole live set, so it
// costs O(changed); one Lease answers it for every tag decode covers.

// peerLease is the rank's heartbeat session with one decode rank.
type peerLease struct {
	decode RankID
	seq    uint64 // the last heartbeat sent
	acked  uint64 // the latest heartbeat decode answered
	// The rank lease: granted in answer to heartbeat leaseSeq by decode
	// instance inst. It covers a stream listed in a heartbeat no later
	// than leaseSeq, of that instance, and not excluded since.
	lease    Time
	leaseSeq uint64
	inst     uint64
	needFull bool // the next heartbeat lists every listed stream (resync)
	// lapseSeen is the grant whose lapse Tick already handed to the
	// streams it covers (lapseTimers).
	lapseSeen uint64
	// The listed set: every stream for this decode rank from its Assign
	// until it stops posting for good. count and digest (sum of TagHash)
	// let decode check that its copy of the set is the same.
	count     uint32
	digest    uint64
	unsettled int          // batches of its live streams that may still move
	delta     []listChange // changes not yet answered, oldest first
	started   []Tag        // scratch for heartbeats, reused
	ended     []Tag        // scratch for heartbeats, reused
}

// listChange is one change of the listed set: sent in every heartbeat from
// the first (seq) until decode answers one of them.
type listChange struct {
	tag   Tag
	ended bool
	seq   uint64 // the heartbeat that first carried it; 0 until sent
}

func (s *Sender) peerFor(decode RankID) *peerLease {
	if p := s.peerByRank[decode]; p != nil {
		return p
	}
	// A new session with this decode rank starts with a full list: decode
	// may hold a session of an earlier incarnation of this rank.
	p := &peerLease{decode: decode, needFull: true}
	if s.peerByRank == nil {
		s.peerByRank = make(map[RankID]*peerLease)
	}
	s.peerByRank[decode] = p
	s.peerList = append(s.peerList, p)
	return p
}

// listStream adds a new stream to its peer's listed set.
func (s *Sender) listStream(st *stream) {
	p := s.peerFor(st.key.decode)
	st.peer, st.listed, st.listedSeq, st.excluded = p, true, 0, false
	p.count++
	p.digest += TagHash(st.key.tag)
	p.delta = append(p.delta, listChange{tag: st.key.tag})
}

// unlistStream takes a stream that will never post again out of the listed
// set. Its lease freezes at what was granted: no later Lease covers it.
func (s *Sender) unlistStream(st *stream) {
	if !st.listed {
		return
	}
	st.lease = s.streamLease(st)
	st.listed = false
	p := st.peer
	p.count--
	p.digest -= TagHash(st.key.tag)
	if st.listedSeq == 0 {
		// No heartbeat carried its start yet: drop that change instead of
		// sending both. Unsent changes are the tail of the queue.
		for i := len(p.delta) - 1; i >= 0 && p.delta[i].seq == 0; i-- {
			if p.delta[i].tag == st.key.tag && !p.delta[i].ended {
				p.delta = append(p.delta[:i], p.delta[i+1:]...)
				return
			}
		}
	}
	p.delta = append(p.delta, listChange{tag: st.key.tag, ended: true})
}

// covered reports whether the rank lease covers st.
func (s *Sender) covered(st *stream) bool {
	p := st.peer
	return p != nil && st.listed && !st.excluded && st.listedSeq != 0 && st.listedSeq <= p.leaseSeq &&
		p.inst == st.key.tag.Instance
}

// leaseDue is when a Tick must look at st's lease by time alone. A covered
// stream's lease moves with every Lease: its entry waits at HoldUntil, and
// the rank lease's own lapse queues it (lapseTimers), so that renewals cost
// no timer work per stream.
func (s *Sender) leaseDue(st *stream) Time {
	if s.covered(st) && st.peer.lapseSeen != st.peer.leaseSeq {
		return max(st.lease, st.holdUntil).Add(-s.cfg.SkewMargin)
	}
	return s.streamLease(st).Add(-s.cfg.SkewMargin)
}

// lapseTimers queues, once per grant, every stream a rank lease that
// lapsed covers: O(peers) per Tick, O(listed) only when a rank lease
// lapses (decode unreachable: each of them fails).
func (s *Sender) lapseTimers(now Time) {
	for _, p := range s.peerList {
		if p.leaseSeq == 0 || p.lapseSeen == p.leaseSeq || now < p.lease.Add(-s.cfg.SkewMargin) {
			continue
		}
		p.lapseSeen = p.leaseSeq
		for _, st := range s.list {
			if st.peer == p && s.covered(st) {
				s.leaseTimers.schedule(st, s.streamLease(st).Add(-s.cfg.SkewMargin))
			}
		}
	}
}

// freeze fixes st's lease at what it was granted and queues its lapse: it
// is about to leave the rank lease's cover.
func (s *Sender) freeze(st *stream) {
	st.lease = s.streamLease(st)
	s.leaseTimers.schedule(st, st.lease.Add(-s.cfg.SkewMargin))
}

// streamLease is the lease a stream posts under: its own (Assign, Grant)
// or, where it is covered, the rank lease, never past the tag's HoldUntil.
func (s *Sender) streamLease(st *stream) Time {
	l := st.lease
	p := st.peer
	if p == nil || !st.listed || p.leaseSeq == 0 {
		return l
	}
	if s.covered(st) {
		if rl := min(p.lease, st.holdUntil); rl > l {
			l = rl
		}
	}
	return l
}

// onLease applies decode's answer to one heartbeat.
func (s *Sender) onLease(m Message) {
	p := s.peerByRank[m.Decode]
	if p == nil || m.Session != s.cfg.Session || m.Seq > p.seq || m.Seq <= p.acked {
		// Another incarnation's, a heartbeat never sent, or overtaken by
		// a later answer.
		s.metrics.StaleMessages++
		return
	}
	p.acked = m.Seq
	if m.Full {
		p.needFull = true // decode lost our list (restart, divergence): send it whole
		return
	}
	n := 0
	for n < len(p.delta) && p.delta[n].seq != 0 && p.delta[n].seq <= m.Seq {
		n++
	}
	p.delta = append(p.delta[:0], p.delta[n:]...)
	// Exclusions first: the lease that follows must never reach them.
	for _, tag := range m.Tags {
		if st := s.stream(streamKey{tag, m.Decode}); st != nil && st.listed && !st.excluded {
			s.freeze(st)
			st.excluded = true
		}
	}
	if m.LeaseUntil != 0 && p.leaseSeq != 0 && m.Tag.Instance != p.inst {
		// Another decode instance (a restart): the streams the earlier
		// one covered keep what it granted. O(listed), once per restart.
		for _, st := range s.list {
			if st.peer == p && s.covered(st) {
				s.freeze(st)
			}
		}
	}
	if m.LeaseUntil != 0 {
		p.lease, p.leaseSeq, p.inst = m.LeaseUntil, m.Seq, m.Tag.Instance
		s.metrics.RankLeases++
	}
}

// heartbeats sends one heartbeat to every decode rank this rank has a
// session with and something to say to: O(changed) each, O(listed) only
// for a resync.
func (s *Sender) heartbeats(now Time) {
	if d := s.policy.SelfLease(); d > 0 {
		for _, st := range s.list {
			if st.state == StreamSending {
				st.lease = now.Add(d) // a lease nobody granted
			}
		}
	}
	for _, p := range s.peerList {
		if p.count == 0 && len(p.delta) == 0 && !p.needFull {
			continue
		}
		p.seq++
		// The tag lists are reused: an Output is valid until the next input.
		started, ended := p.started[:0], p.ended[:0]
		m := Message{Kind: KindHeartbeat, Rank: s.cfg.Rank, Decode: p.decode, Session: s.cfg.Session, Seq: p.seq,
			Count: p.count, Digest: p.digest, Outstanding: uint32(p.unsettled)}
		if len(p.delta) > 2*int(p.count)+64 {
			// Unanswered for long: the whole list is shorter than the
			// changes, and bounds what one heartbeat carries.
			p.needFull = true
		}
		if p.needFull {
			m.Full, p.needFull = true, false
			p.delta = p.delta[:0]
			for _, st := range s.list {
				if st.peer == p && st.listed {
					s.freeze(st) // what was granted stays granted
					st.listedSeq = p.seq
					started = append(started, st.key.tag)
				}
			}
		} else {
			for i := range p.delta {
				c := &p.delta[i]
				if c.seq == 0 {
					c.seq = p.seq
					if st := s.stream(streamKey{c.tag, p.decode}); !c.ended && st != nil && st.listed && st.listedSeq == 0 {
						st.listedSeq = p.seq
					}
				}
				if c.ended {
					ended = append(ended, c.tag)
				} else {
					started = append(started, c.tag)
				}
			}
		}
		p.started, p.ended = started, ended
		m.Tags, m.Ended = started, ended
		s.metrics.Heartbeats++
		s.out.Messages = append(s.out.Messages, Envelope{To: p.decode, Msg: m})
	}
}
