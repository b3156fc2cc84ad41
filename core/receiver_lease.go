package core

// This file: decode's side of the heartbeat and the rank lease
// (docs/design.md §3, Heartbeats and the rank lease). Decode keeps a copy
// of each rank's listed set, built from the changes each heartbeat carries
// and checked against its count and digest, and answers with one Lease for
// every listed tag it still covers: O(changed) per heartbeat.

// MaxStaleAborts bounds the Aborts one Lease answer sends for listed tags
// this instance does not hold (stopExcluded); the rest get theirs from
// later answers. It keeps the work a heartbeat can cause bounded.
const MaxStaleAborts = 64

// maxListed bounds decode's copy of one rank's list: far above what an
// honest rank lists (its tags here and of the instance before a restart,
// each holding at least a slot, and ones released but not yet ended),
// so that a hostile rank cannot grow it without bound. Past it the
// session resets: the copy is dropped and a full list asked for.
func (r *Receiver) maxListed() uint32 { return uint32(min(4*r.cfg.Slots+256, 1<<31)) }

// rankLease is decode's side of one prefill rank's heartbeat session.
type rankLease struct {
	session  uint64 // the rank incarnation it belongs to
	seq      uint64 // the last heartbeat applied
	needFull bool   // only a full heartbeat may (re)start it
	// The rank lease, granted in answer to heartbeat leaseSeq: it covers
	// the tracks listed in a heartbeat no later than that.
	lease    Time
	leaseSeq uint64
	// The copy of the rank's listed set: listed tracks (rankTrack.listed)
	// and excluded tags, with their count and digest.
	count     uint32
	digest    uint64
	listed    int    // tracks listed
	covered   int    // of them, listed no later than leaseSeq
	pending   []Tag  // listed since the last grant: checked at the next one
	lapseSeen uint64 // the grant whose lapse Tick already queued (lapseTimers)
	rank      RankID
	excluded  []Tag // in the rank's list but not covered: named in every Lease
	exclIdx   map[Tag]int
	cursor    int // where stopExcluded starts next
}

func (rl *rankLease) exclude(tag Tag) {
	if _, ok := rl.exclIdx[tag]; ok {
		return
	}
	if rl.exclIdx == nil {
		rl.exclIdx = make(map[Tag]int)
	}
	rl.exclIdx[tag] = len(rl.excluded)
	rl.excluded = append(rl.excluded, tag)
}

func (rl *rankLease) unexclude(tag Tag) bool {
	i, ok := rl.exclIdx[tag]
	if !ok {
		return false
	}
	last := rl.excluded[len(rl.excluded)-1]
	rl.excluded[i] = last
	rl.exclIdx[last] = i
	rl.excluded = rl.excluded[:len(rl.excluded)-1]
	delete(rl.exclIdx, tag)
	return true
}

// covered reports whether the rank lease covers rank t of an exposure.
func (r *Receiver) covered(t *rankTrack) bool {
	if !t.listed {
		return false
	}
	rl := r.leases[t.rank]
	return rl != nil && rl.leaseSeq >= t.listedSeq
}

// trackDue is when a Tick must look at rank t's lease by time alone. A
// covered track's lease moves with every Lease: it waits at admission +
// MaxHold, and the rank lease's own lapse queues it (lapseTimers), so
// that renewals cost no timer work per exposure.
func (r *Receiver) trackDue(e *exposure, t *rankTrack) Time {
	if r.covered(t) && r.leases[t.rank].lapseSeen != r.leases[t.rank].leaseSeq {
		return max(t.lease, e.admitted.Add(r.cfg.MaxHold))
	}
	return r.trackLease(e, t)
}

// lapseTimers queues, once per grant, every exposure with a track that a
// rank lease that lapsed covers: O(ranks) per Tick, O(live) only when a
// rank lease lapses (the rank went silent: each of them aborts).
func (r *Receiver) lapseTimers(now Time) {
	for _, rl := range r.leaseList {
		if rl.covered == 0 || rl.lapseSeen == rl.leaseSeq || now < rl.lease {
			continue
		}
		rl.lapseSeen = rl.leaseSeq
		for _, e := range r.list {
			if t := e.track(rl.rank); t != nil && r.covered(t) {
				r.timers.schedule(e, r.trackLease(e, t))
			}
		}
	}
}

// trackLease is the latest lease decode granted rank t for e: its own
// (Assign) or, while it is listed and covered, the rank lease, never past
// admission + MaxHold.
func (r *Receiver) trackLease(e *exposure, t *rankTrack) Time {
	l := t.lease
	if !t.listed {
		return l
	}
	if rl := r.leases[t.rank]; rl != nil && rl.leaseSeq >= t.listedSeq {
		if g := min(rl.lease, e.admitted.Add(r.cfg.MaxHold)); g > l {
			l = g
		}
	}
	return l
}

// uncover stops covering rank t of e (it committed, failed, acked, or e
// aborted): its lease freezes at what was granted, and the tag is excluded
// from every later Lease until the rank says it ended.
func (r *Receiver) uncover(e *exposure, t *rankTrack) {
	if !t.listed {
		return
	}
	rl := r.leases[t.rank]
	r.unlistTrack(e, t, rl)
	rl.exclude(e.tag)
}

func (r *Receiver) uncoverAll(e *exposure) {
	for i := range e.ranks {
		r.uncover(e, &e.ranks[i])
	}
}

func (r *Receiver) unlistTrack(e *exposure, t *rankTrack, rl *rankLease) {
	if r.policy.FreezeRankLease() {
		t.lease = r.trackLease(e, t)
	}
	t.listed = false
	r.timers.schedule(e, t.lease) // its lease no longer moves with the rank's
	rl.listed--
	if t.listedSeq <= rl.leaseSeq {
		rl.covered--
	}
}

// onHeartbeat applies one heartbeat and answers it with a Lease.
func (r *Receiver) onHeartbeat(m Message, now Time) {
	rl := r.leases[m.Rank]
	if rl == nil {
		rl = &rankLease{needFull: true, rank: m.Rank}
		if r.leases == nil {
			r.leases = make(map[RankID]*rankLease)
		}
		r.leases[m.Rank] = rl
		r.leaseList = append(r.leaseList, rl)
	}
	switch {
	case m.Full:
		if !rl.needFull && m.Session == rl.session && m.Seq <= rl.seq {
			r.metrics.StaleMessages++ // an older full list, overtaken
			return
		}
		r.resetLease(m.Rank, rl)
		rl.session, rl.seq, rl.needFull = m.Session, m.Seq, false
		for _, tag := range m.Tags {
			r.listTag(rl, m.Rank, tag, m.Seq, now)
		}
	case rl.needFull || m.Session != rl.session:
		// This decode instance never had the list the changes apply to
		// (it restarted, or reset the session), or a new incarnation of
		// the rank lost its full list: only a full list starts again.
		r.askFull(m)
		return
	case m.Seq <= rl.seq:
		r.metrics.StaleMessages++ // duplicated or overtaken
		return
	default:
		rl.seq = m.Seq
		for _, tag := range m.Tags {
			r.listTag(rl, m.Rank, tag, m.Seq, now)
		}
		for _, tag := range m.Ended {
			r.endTag(rl, m.Rank, tag)
		}
	}
	if m.Count != rl.count || m.Digest != rl.digest || rl.count > r.maxListed() {
		// The copies diverged: never grant over a list decode does not
		// know. Start again from a full one.
		r.resetLease(m.Rank, rl)
		r.askFull(m)
		return
	}
	r.grant(rl, m, now)
}

func (r *Receiver) askFull(m Message) {
	r.metrics.Resyncs++
	r.send(m.Rank, Message{Kind: KindLease, Tag: Tag{Instance: r.cfg.Instance}, Session: m.Session, Seq: m.Seq, Full: true})
}

// listTag adds a tag the rank listed to decode's copy: covered from the
// next grant if decode holds it assigned to that rank with a live lease,
// otherwise excluded (and told to stop, as an old per-tag heartbeat was).
func (r *Receiver) listTag(rl *rankLease, rank RankID, tag Tag, seq uint64, now Time) {
	if _, ok := rl.exclIdx[tag]; ok {
		return // already in the copy (a change sent again)
	}
	e := r.lookupMsg(tag)
	var t *rankTrack
	if e != nil {
		t = e.track(rank)
	}
	if t != nil && t.listed {
		return
	}
	rl.count++
	rl.digest += TagHash(tag)
	switch {
	case e == nil:
		// The rank still works for a tag this instance does not hold (an
		// old instance's, or one already released): the answer tells it
		// to stop (stopExcluded).
		r.metrics.StaleMessages++
	case t == nil:
		r.metrics.ForeignMessages++
	case e.state == StateAssigned && !t.committed && !t.failed && !t.acked && now < r.trackLease(e, t):
		t.listed, t.listedSeq = true, seq
		rl.listed++
		rl.pending = append(rl.pending, tag)
		return
	}
	// A lapsed lease is never renewed, nor one of a tag that stopped.
	rl.exclude(tag)
}

// endTag removes a tag the rank says it stopped posting for.
func (r *Receiver) endTag(rl *rankLease, rank RankID, tag Tag) {
	if rl.unexclude(tag) {
		rl.count--
		rl.digest -= TagHash(tag)
		return
	}
	e := r.lookupMsg(tag)
	if e == nil {
		return
	}
	if t := e.track(rank); t != nil && t.listed {
		r.unlistTrack(e, t, rl)
		rl.count--
		rl.digest -= TagHash(tag)
	}
}

// grant answers a heartbeat whose list matched: the rank lease for every
// listed tag decode covers, and the listed tags it does not.
func (r *Receiver) grant(rl *rankLease, m Message, now Time) {
	r.stopExcluded(rl, m.Rank, now)
	answer := Message{Kind: KindLease, Tag: Tag{Instance: r.cfg.Instance}, Session: m.Session, Seq: m.Seq}
	if rl.covered > 0 && now >= rl.lease {
		// The covered tracks' leases lapsed with it: a lapsed lease is
		// never renewed. Tick aborts them (and excludes them); grant then.
		answer.Tags = rl.excluded
		r.send(m.Rank, answer)
		return
	}
	for _, tag := range rl.pending {
		if e := r.lookupMsg(tag); e != nil {
			if t := e.track(m.Rank); t != nil && t.listed && now >= r.trackLease(e, t) {
				r.uncover(e, t) // its own lease lapsed while it waited for a grant
			}
		}
	}
	rl.pending = rl.pending[:0]
	lease := max(now.Add(r.cfg.Lease), rl.lease)
	rl.lease, rl.leaseSeq, rl.covered = lease, m.Seq, rl.listed
	r.metrics.Grants++
	answer.LeaseUntil = lease
	answer.Tags = rl.excluded // valid until the next input, like every Output
	r.send(m.Rank, answer)
}

// stopExcluded tells the rank again to stop every excluded tag that decode
// no longer holds or holds aborting without its drain, as a per-tag
// heartbeat naming it was answered: an Abort may have been lost, and only
// the rank's listed set still knows the tag. O(excluded): the changes the
// rank has not caught up with.
func (r *Receiver) stopExcluded(rl *rankLease, rank RankID, now Time) {
	stale := 0
	for i := range rl.excluded {
		// Start where the last answer stopped: every stale tag gets its
		// turn even when more than MaxStaleAborts are listed.
		tag := rl.excluded[(rl.cursor+i)%len(rl.excluded)]
		e := r.lookupMsg(tag)
		if e == nil {
			if stale++; stale > MaxStaleAborts {
				rl.cursor = (rl.cursor + i) % len(rl.excluded)
				return
			}
			reason := ReasonDecodeAbort
			if tag.Instance != r.cfg.Instance {
				reason = ReasonDecodeRestart
			}
			r.send(rank, Message{Kind: KindAbort, Tag: tag, Reason: reason})
			continue
		}
		if t := e.track(rank); t != nil && e.state == StateAborting && !t.acked {
			r.sendAbort(e, t, now)
		}
	}
}

// resetLease forgets decode's copy of a rank's list: every listed track's
// lease freezes at what was granted. O(live), only on a resync, a rank's
// death or a new incarnation of the rank.
func (r *Receiver) resetLease(rank RankID, rl *rankLease) {
	for _, e := range r.list {
		for i := range e.ranks {
			if t := &e.ranks[i]; t.rank == rank && t.listed {
				r.unlistTrack(e, t, rl)
			}
		}
	}
	rl.count, rl.digest, rl.listed, rl.covered = 0, 0, 0, 0
	rl.pending = rl.pending[:0]
	rl.excluded = rl.excluded[:0]
	clear(rl.exclIdx)
	rl.needFull = true
}
