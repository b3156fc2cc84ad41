package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// ExposureState is where a decode exposure is in its life.
type ExposureState uint8

const (
	StateAssigned ExposureState = iota + 1 // ranks may write; not handed off
	StateAborting                          // held: waiting for drained, fenced or timeout
	StateHanded                            // every rank committed: the decode loop owns it
)

func (s ExposureState) String() string {
	switch s {
	case StateAssigned:
		return "assigned"
	case StateAborting:
		return "aborting"
	case StateHanded:
		return "handed"
	}
	return "state?"
}

// rankTrack is decode's view of one prefill rank for one tag. Acks are kept
// per (tag, rank): one ack target per room breaks fan-out.
type rankTrack struct {
	rank      RankID
	lease     Time   // its own lease (Assign); frozen at the latest granted once unlisted
	listed    bool   // in the rank's listed set: the rank lease may cover it (receiver_lease.go)
	listedSeq uint64 // the heartbeat that listed it
	committed bool
	acked     bool
	failed    bool
	dead      bool // declared dead (PeerDead): it will never drain
	coverage  uint32
}

type exposure struct {
	tag       Tag
	state     ExposureState
	slots     []uint32
	rankIDs   []RankID
	ranks     []rankTrack
	admitted  Time
	stopped   Time // when it left Assigned for Aborting
	reason    Reason
	rejected  bool
	revoking  bool
	revokeAt  Time
	revoked   bool // the transport confirmed the revocation (handed exposures only)
	finished  bool // the decode loop finished it; waiting for revoked
	lastAbort Time
	idx       int
	timerSlot     // in Receiver.timers
	target    int // the target plugin instance that serves it (restart fence)
}

// Receiver is the core of one decode rank: it owns the slot pool and every
// exposure over it, and decides handoffs and releases.
type Receiver struct {
	cfg     ReceiverConfig
	policy  policy // the rules a known-unsafe variant may change (policy.go)
	pool    *SlotPool
	byKey   keyIndex[*exposure] // by request key (keyindex.go)
	list    []*exposure         // deterministic iteration order
	spare   []*exposure
	timers  deadlines[*exposure] // by the earliest time Tick may act on them
	due     []*exposure          // scratch for Tick
	out     Output
	metrics ReceiverMetrics

	quarantine      []uint32
	quarantineUntil Time
	quarantineStart Time

	tails map[RankID]time.Duration // declared by RankTail; only ever grows
	dead  map[RankID]bool          // declared dead by PeerDead, until it links again (RankTail)
	// unisolated: ranks whose transport said a refused write may fail the
	// writes beside it (RankRefusals); the latest declaration counts.
	unisolated map[RankID]bool

	leases    map[RankID]*rankLease // heartbeat sessions (receiver_lease.go)
	leaseList []*rankLease          // the same, in a deterministic order

	targets []targetState // restart fence: one per target instance (receiver_restart.go)
}

// NewReceiver makes the core of one decode rank at time now. With
// cfg.Restarted the whole pool starts quarantined (docs/design.md §3, Restart).
func NewReceiver(cfg ReceiverConfig, now Time) (*Receiver, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pol, err := policyFor(cfg.Unsafe)
	if err != nil {
		return nil, err
	}
	r := &Receiver{
		cfg:    cfg,
		policy: pol,
		pool:   NewSlotPool(cfg.Slots),
		byKey:  keyIndex[*exposure]{seed: processSeed ^ cfg.Instance},
	}
	if cfg.EnginePages > 0 {
		r.pool = NewEnginePool(cfg.EnginePages, cfg.Slots)
	}
	r.metrics.SlotBytes = cfg.SlotBytes
	r.timers.widen(cfg.Lease) // leases and what follows them are near; rank-lease-covered holds wait far
	if cfg.Restarted && pol.QuarantineOnRestart() {
		r.quarantine = r.pool.takeAll()
		r.quarantineStart = now
		// The earlier instance's writers and their tails are unknown here:
		// the bound starts from our own MaxTail, and RankTail extends it for
		// every writer that declares a longer one while it lasts.
		r.quarantineUntil = now.Add(cfg.MaxHold).Add(cfg.MaxTail).Add(cfg.ClockMargin)
		r.metrics.QuarantinedSlots = len(r.quarantine)
		if cfg.CanRevoke {
			r.out.Revokes = append(r.out.Revokes, Revoke{All: true})
		}
	}
	return r, nil
}

// RankTail records the tail that a prefill rank's transport declared
// (Capabilities.MaxTail, sent in its Hello): how long after being posted one
// of its writes may still land. The tail belongs to the writer's transport
// (an RDMA queue pair keeps retrying on the sender's side), so every timeout
// bound over that rank's writes uses the larger of it and this receiver's own
// MaxTail; a rank that never declared one gets MaxTail. A rank's tail never
// shrinks within an instance: writes posted under an earlier declaration may
// still be in flight. While the restart quarantine lasts, a longer tail
// extends it too (the rank may have written to the earlier instance).
//
// A tail above the configured MaxDeclaredTail (or a negative one) is
// refused with errdefs.InvalidArgument and changes nothing: the caller must not
// let that rank write here (refuse its Hello). It changes no state that
// could release anything, so it produces no output and leaves Ready as it
// was.
//
// The caller reports a rank's tail each time the rank links (its Hello): a
// rank that was declared dead (PeerDead) and links again may be named by
// admissions again.
func (r *Receiver) RankTail(rank RankID, tail time.Duration) error {
	if err := r.CheckTail(rank, tail); err != nil {
		return err
	}
	delete(r.dead, rank)
	if r.tails == nil {
		r.tails = make(map[RankID]time.Duration)
	}
	if tail > r.tails[rank] {
		r.tails[rank] = tail
	}
	if r.quarantine != nil {
		if until := r.quarantineStart.Add(r.cfg.MaxHold).Add(r.Tail(rank)).Add(r.cfg.ClockMargin); until > r.quarantineUntil {
			r.quarantineUntil = until
		}
	}
	return nil
}

// RankRefusals records what a prefill rank's transport declares (in its
// Hello) of a write refused under a revoked key: isolated, it fails alone;
// not isolated, it may fail the writes queued beside it on the same
// connection — other requests' (an older plugin). Under EagerRevoke an
// aborted exposure is revoked at the abort only when every rank writing
// it isolates refusals, after its drain otherwise: revoking at the abort
// would fail its neighbours' transfers. Both orders keep every byte where
// it belongs; this is about the neighbours. A rank never declared counts
// as isolating; the latest declaration counts (a rank that links again
// may run another version). It produces no output.
func (r *Receiver) RankRefusals(rank RankID, isolated bool) {
	if isolated {
		delete(r.unisolated, rank)
		return
	}
	if r.unisolated == nil {
		r.unisolated = make(map[RankID]bool)
	}
	r.unisolated[rank] = true
}

// refusalsIsolated: no rank writing e declared unisolated refusals.
func (r *Receiver) refusalsIsolated(e *exposure) bool {
	for i := range e.ranks {
		if r.unisolated[e.ranks[i].rank] {
			return false
		}
	}
	return true
}

// CheckTail says whether RankTail would accept a tail a rank declares, and
// if not, why. It reads only the configuration, so a caller may use it from
// any goroutine (to refuse a Hello before the rank links).
func (r *Receiver) CheckTail(rank RankID, tail time.Duration) error {
	switch {
	case tail < 0:
		return errorf(errdefs.InvalidArgument, "rank %d: declared transport tail must not be negative, got %v", rank, tail)
	case tail > r.cfg.MaxDeclaredTail && !r.restartFenced():
		// Above the maximum only with a restart fence: such holds end by
		// restarting the target instance, never by timeout.
		return errorf(errdefs.InvalidArgument, "rank %d: declared transport tail %v is above this decode rank's maximum %v (MaxDeclaredTail): every hold over its writes would last that long",
			rank, tail, r.cfg.MaxDeclaredTail)
	}
	return nil
}

// Tail is the tail that bounds a rank's writes: the larger of the tail it
// declared (RankTail) and this receiver's own MaxTail.
func (r *Receiver) Tail(rank RankID) time.Duration {
	tail := r.cfg.MaxTail
	if !r.policy.CountDeclaredTails() {
		return tail
	}
	if t := r.tails[rank]; t > tail {
		tail = t
	}
	return tail
}

// Ready returns what the last input produced. It stays valid until the next
// input; messages reference the core's own slices, so copy or encode them
// before then.
func (r *Receiver) Ready() *Output { return &r.out }

// Metrics returns the counters and gauges operators graph.
func (r *Receiver) Metrics() ReceiverMetrics { return r.metrics }

// FreeSlots is the number of slots Admit can take now.
func (r *Receiver) FreeSlots() int { return r.pool.Free() }

// Instance is this receiver's decode incarnation.
func (r *Receiver) Instance() uint64 { return r.cfg.Instance }

// State reports the state of a tag's exposure, or false if it has none.
func (r *Receiver) State(tag Tag) (ExposureState, bool) {
	e := r.lookup(tag)
	if e == nil {
		return 0, false
	}
	return e.state, true
}

// Admit exposes pages slots for a request that the given prefill ranks will
// all write, and emits one Assign per rank. The pool picks the slots; a
// receiver over engine pages (EnginePages) refuses it: use AdmitAt.
//
// An admission that names a rank declared dead (PeerDead, and not linked
// again since: RankTail) is refused with errdefs.Unavailable naming that rank,
// and nothing is exposed: a dead rank never writes, commits or drains, so
// admitting would only hold the slots until a fence or the bound.
func (r *Receiver) Admit(key RequestKey, ranks []RankID, pages int, now Time) (Tag, error) {
	r.out.reset()
	if r.pool.EngineChosen() {
		return Tag{}, errorf(errdefs.FailedPrecondition, "request %s: the engine names the pages in direct mode (AdmitAt)", key)
	}
	if err := r.checkAdmit(key, ranks, pages); err != nil {
		return Tag{}, err
	}
	if r.pool.Free() < pages {
		return Tag{}, errorf(errdefs.ResourceExhausted, "request %s needs %d slots, %d free", key, pages, r.pool.Free())
	}
	target, ok := r.pickTarget()
	if !ok {
		return Tag{}, errorf(errdefs.ResourceExhausted, "request %s: every target instance is restarting", key)
	}
	e := r.newExposure()
	e.slots = r.pool.take(e.slots, pages)
	r.expose(e, key, ranks, target, now)
	return e.tag, nil
}

// AdmitAt is Admit in direct mode (EnginePages): the request's pages land
// at the engine's own page indices idx, in order. A page still lent to
// another exposure — live, or held until drained, fenced or timed out — is
// refused with errdefs.FailedPrecondition and nothing is exposed: a page is
// never lent twice, so no write of one request can land in another's page.
// Pages out of range or named twice are InvalidArgument; more pages than
// the capacity (Slots, holds count) allows now, ResourceExhausted.
func (r *Receiver) AdmitAt(key RequestKey, ranks []RankID, idx []uint32, now Time) (Tag, error) {
	r.out.reset()
	if !r.pool.EngineChosen() {
		return Tag{}, errorf(errdefs.FailedPrecondition, "request %s: engine-chosen pages need a receiver over engine pages (EnginePages)", key)
	}
	if err := r.checkAdmit(key, ranks, len(idx)); err != nil {
		return Tag{}, err
	}
	target, ok := r.pickTarget()
	if !ok {
		return Tag{}, errorf(errdefs.ResourceExhausted, "request %s: every target instance is restarting", key)
	}
	if err := r.pool.takeAt(idx, r.lentTo); err != nil {
		return Tag{}, fmt.Errorf("request %s: %w", key, err)
	}
	e := r.newExposure()
	e.slots = append(e.slots, idx...)
	r.expose(e, key, ranks, target, now)
	return e.tag, nil
}

// checkAdmit refuses an admission before anything is taken.
func (r *Receiver) checkAdmit(key RequestKey, ranks []RankID, pages int) error {
	switch {
	case pages <= 0:
		return errorf(errdefs.InvalidArgument, "request %s: pages must be positive, got %d", key, pages)
	case len(ranks) == 0 || len(ranks) > MaxWireRanks:
		return errorf(errdefs.InvalidArgument, "request %s: %d ranks, want 1..%d", key, len(ranks), MaxWireRanks)
	case pages > MaxWireSlots:
		return errorf(errdefs.InvalidArgument, "request %s: %d pages, more than %d", key, pages, MaxWireSlots)
	}
	for i := range ranks {
		for j := i + 1; j < len(ranks); j++ {
			if ranks[i] == ranks[j] {
				return errorf(errdefs.InvalidArgument, "request %s: rank %d named twice", key, ranks[i])
			}
		}
	}
	for _, id := range ranks {
		if r.dead[id] {
			return errorf(errdefs.Unavailable, "request %s: prefill rank %d was declared dead and has not linked again", key, id)
		}
	}
	if r.byKey.get(key) != nil {
		return errorf(errdefs.AlreadyExists, "request %s is already exposed", key)
	}
	return nil
}

// expose makes e (its slots taken) a live exposure and sends the Assigns.
func (r *Receiver) expose(e *exposure, key RequestKey, ranks []RankID, target int, now Time) {
	r.attachTarget(e, target)
	e.tag = Tag{Instance: r.cfg.Instance, Room: key.Room, Gen: key.Gen}
	e.state = StateAssigned
	e.admitted = now
	lease := now.Add(r.cfg.Lease)
	for _, id := range ranks {
		e.rankIDs = append(e.rankIDs, id)
		e.ranks = append(e.ranks, rankTrack{rank: id, lease: lease})
	}
	r.byKey.put(key, e)
	e.idx = len(r.list)
	r.list = append(r.list, e)
	r.timers.schedule(e, lease)
	r.metrics.Admitted++
	r.metrics.AssignedSlots += len(e.slots)
	for _, id := range ranks {
		r.send(id, Message{Kind: KindAssign, Tag: e.tag, LeaseUntil: lease, HoldUntil: now.Add(r.cfg.MaxHold), Ranks: e.rankIDs, Slots: e.slots})
	}
}

// lentTo names what holds an engine page, for a refusal's message.
func (r *Receiver) lentTo(page uint32) string {
	for _, e := range r.list {
		if slices.Contains(e.slots, page) {
			return fmt.Sprintf("request %s (%s)", e.tag, e.state)
		}
	}
	return "the restart quarantine"
}

// Abort stops a request that is still being written: its memory is held
// until every rank drained, a fence, or the timeout bound.
func (r *Receiver) Abort(tag Tag, reason Reason, now Time) error {
	r.out.reset()
	return r.stop(tag, reason, false, now)
}

// Reject refuses a request after assignment: it is never handed off, and
// its memory is held like an abort's.
func (r *Receiver) Reject(tag Tag, now Time) error {
	r.out.reset()
	return r.stop(tag, ReasonRejected, true, now)
}

func (r *Receiver) stop(tag Tag, reason Reason, reject bool, now Time) error {
	e := r.lookup(tag)
	if e == nil {
		return errorf(errdefs.NotFound, "no exposure for tag %s", tag)
	}
	switch e.state {
	case StateHanded:
		return errorf(errdefs.FailedPrecondition, "tag %s was handed off: finish it instead", tag)
	case StateAborting:
		return nil
	}
	r.startAbort(e, reason, reject, now)
	return nil
}

// Finish returns a handed-off request's slots once the decode loop is done.
// With a fence, the slots go back only once the keys the ranks wrote under
// are revoked (Revoked; the revoke was asked for at handoff, so it has
// usually been confirmed by then): a rank's Commit is its word, not
// evidence. Finishing twice is harmless.
func (r *Receiver) Finish(tag Tag, now Time) error {
	r.out.reset()
	e := r.lookup(tag)
	if e == nil {
		return errorf(errdefs.NotFound, "no exposure for tag %s", tag)
	}
	if e.state != StateHanded {
		return errorf(errdefs.FailedPrecondition, "tag %s is %s: only handed-off requests finish", tag, e.state)
	}
	if r.fenceFirst() && !e.revoked {
		e.finished = true
		r.timers.schedule(e, MinTime)
		return nil
	}
	r.release(e, PathCompleted, now)
	return nil
}

// PeerDead aborts every exposure a dead rank was writing. Its writes can
// stop only by fence or timeout: a dead rank never drains. Until the rank
// links again (RankTail), Admit refuses every request that names it.
func (r *Receiver) PeerDead(rank RankID, now Time) {
	r.out.reset()
	r.metrics.PeerDeaths++
	if r.dead == nil {
		r.dead = make(map[RankID]bool)
	}
	r.dead[rank] = true
	for i := 0; i < len(r.list); i++ {
		e := r.list[i]
		t := e.track(rank)
		if t == nil {
			continue
		}
		t.failed, t.dead = true, true
		r.timers.schedule(e, MinTime) // a dead writer may be fenced at once
		if e.state == StateAssigned {
			if r.startAbort(e, ReasonPeerDead, false, now) {
				i--
			}
		}
	}
	if rl := r.leases[rank]; rl != nil {
		r.resetLease(rank, rl) // if it links again, its session starts from a full list
	}
}

// Revoked reports that the transport revoked a tag's keys: no write under
// them can land any more. An aborting exposure is released at once: by
// drained if every rank had acknowledged its drain (with a fence, drained
// releases wait for this), by fenced if not. A handed-off one is released
// if the decode loop already finished it.
func (r *Receiver) Revoked(tag Tag, now Time) {
	r.out.reset()
	e := r.lookup(tag)
	if e == nil {
		return
	}
	switch e.state {
	case StateAborting:
		path := PathFenced
		if e.allAcked() {
			path = PathDrained
		}
		r.release(e, path, now)
	case StateHanded:
		e.revoked = true
		if e.finished {
			r.release(e, PathCompleted, now)
		}
	}
}

// RevokedAll reports that every key of an earlier instance is revoked: the
// restart quarantine ends.
func (r *Receiver) RevokedAll(now Time) {
	r.out.reset()
	r.endQuarantine(PathFenced, now)
}

// Step applies one control message from a prefill rank.
func (r *Receiver) Step(m Message, now Time) {
	r.out.reset()
	if m.Decode != r.cfg.Self {
		r.metrics.ForeignMessages++
		return
	}
	if m.Kind == KindHeartbeat {
		r.onHeartbeat(m, now)
		return
	}
	e := r.lookupMsg(m.Tag)
	if e == nil {
		r.metrics.StaleMessages++
		return
	}
	t := e.track(m.Rank)
	if t == nil {
		r.metrics.ForeignMessages++
		return
	}
	switch m.Kind {
	case KindCommit:
		r.onCommit(e, t, m.Coverage, now)
	case KindFail:
		r.uncover(e, t)
		t.failed = true
		if e.state == StateAssigned {
			reason := m.Reason
			if reason == ReasonNone {
				reason = ReasonSendFailed
			}
			r.startAbort(e, reason, false, now)
		}
	case KindDrainAck:
		switch e.state {
		case StateAssigned:
			r.markAcked(e, t)
			r.startAbort(e, ReasonClientAbort, false, now)
		case StateAborting:
			r.markAcked(e, t)
			r.checkRelease(e, now)
		}
	default:
		r.metrics.ForeignMessages++ // decode never receives decode → rank kinds
	}
}

func (r *Receiver) onCommit(e *exposure, t *rankTrack, coverage uint32, now Time) {
	switch e.state {
	case StateAborting:
		// A Commit means every write of that rank succeeded and is
		// quiescent: it is that rank's drain.
		t.committed = true
		r.markAcked(e, t)
		r.checkRelease(e, now)
	case StateAssigned:
		r.uncover(e, t)
		t.committed = true
		t.coverage = coverage
		if int(coverage) < len(e.slots) && r.policy.CheckCoverage() {
			// Pages nobody wrote must never reach decode (I2).
			r.metrics.ShortCoverage++
			r.markAcked(e, t)
			r.startAbort(e, ReasonShortCoverage, false, now)
			return
		}
		for i := range e.ranks {
			if !e.ranks[i].committed {
				return
			}
		}
		e.state = StateHanded
		r.metrics.Handoffs++
		r.metrics.AssignedSlots -= len(e.slots)
		r.metrics.HandedSlots += len(e.slots)
		r.out.Handoffs = append(r.out.Handoffs, Handoff{Tag: e.tag, Slots: e.slots})
		if r.fenceFirst() {
			// Nobody may write any more: fence now, so that the revocation
			// is usually confirmed before the decode loop finishes.
			r.requestRevoke(e, now)
		}
	}
}

func (r *Receiver) markAcked(e *exposure, t *rankTrack) {
	r.uncover(e, t)
	// The bound over the ranks that did not ack may now be earlier.
	r.timers.schedule(e, MinTime)
	if !r.policy.AckPerRank() {
		for i := range e.ranks {
			e.ranks[i].acked = true
		}
		return
	}
	t.acked = true
}

// Tick advances decode's timers: leases that ran out abort their tag, held
// exposures are released once their bound passed, aborts are resent.
func (r *Receiver) Tick(now Time) {
	r.out.reset()
	if r.quarantine != nil && now >= r.quarantineUntil {
		r.endQuarantine(PathTimeout, now)
	}
	// Only exposures whose time may have come: the rest are untouched.
	// They are visited in list order, as a walk of the list would.
	r.lapseTimers(now)
	due := r.timers.popDue(now, r.due[:0])
	slices.SortFunc(due, func(a, b *exposure) int { return a.idx - b.idx })
	for _, e := range due {
		if e.hpos != 0 || r.byKey.get(e.tag.Key()) != e {
			continue // released, or queued again, by an earlier one in this Tick
		}
		r.tickExposure(e, now)
		if r.byKey.get(e.tag.Key()) == e {
			if t, ok := r.nextDue(e); ok {
				r.timers.schedule(e, t)
			}
		}
	}
	clear(due)
	r.due = due[:0]
	// With a restart fence configured, this walks the aborting exposures
	// (receiver_restart.go): O(live) only on such decode ranks.
	r.tickRestart(now)
}

// tickExposure does what time alone asks of one exposure at now.
func (r *Receiver) tickExposure(e *exposure, now Time) {
	switch e.state {
	case StateAssigned:
		for j := range e.ranks {
			if t := &e.ranks[j]; !t.committed && now >= r.trackLease(e, t) {
				r.startAbort(e, ReasonLeaseLapsed, false, now)
				return
			}
		}
	case StateAborting:
		if now.Sub(e.lastAbort) >= r.cfg.AbortRetransmit {
			for j := range e.ranks {
				if t := &e.ranks[j]; !t.acked {
					r.sendAbort(e, t, now)
				}
			}
		}
		r.checkRelease(e, now)
	case StateHanded:
		if e.finished {
			r.releaseAtBound(e, false, PathCompleted, now)
		}
	}
}

// nextDue is the earliest time tickExposure may act on e while no input
// touches it, and false if only an input can make it act. Every condition
// of tickExposure that time alone can make true is a "now >= x": nextDue
// is the smallest such x.
func (r *Receiver) nextDue(e *exposure) (Time, bool) {
	switch e.state {
	case StateAssigned:
		due := MaxTime
		for j := range e.ranks {
			if t := &e.ranks[j]; !t.committed {
				due = min(due, r.trackDue(e, t))
			}
		}
		return due, true
	case StateAborting:
		due := r.releaseDue(e, !e.allAcked())
		if !e.allAcked() {
			due = min(due, e.lastAbort.Add(r.cfg.AbortRetransmit))
		}
		return due, true
	case StateHanded:
		if e.finished {
			return r.releaseDue(e, false), true
		}
	}
	return 0, false
}

// releaseDue is the earliest time releaseAtBound(e, unacked) may act: the
// write bound, and with a revoke asked for, past its longest tail too.
func (r *Receiver) releaseDue(e *exposure, unacked bool) Time {
	bound, tail := r.writeBound(e, unacked)
	if r.cfg.CanRevoke && e.revoking {
		bound = max(bound, e.revokeAt.Add(tail).Add(r.cfg.ClockMargin))
	}
	return bound
}

// startAbort moves an assigned exposure to Aborting. It reports whether the
// exposure left the list (only unsafe variants release at once).
func (r *Receiver) startAbort(e *exposure, reason Reason, reject bool, now Time) bool {
	e.state = StateAborting
	e.stopped = now
	e.reason = reason
	e.rejected = reject
	r.uncoverAll(e) // no rank lease reaches an aborting tag
	r.metrics.AssignedSlots -= len(e.slots)
	r.metrics.HeldSlots += len(e.slots)
	r.metrics.HeldBytes += int64(len(e.slots)) * r.cfg.SlotBytes
	if reject {
		r.metrics.Rejects++
	} else {
		r.metrics.Aborts++
	}
	r.out.Failures = append(r.out.Failures, Failure{Tag: e.tag, Reason: reason})
	for i := range e.ranks {
		if e.ranks[i].committed {
			e.ranks[i].acked = true // Commit implies drained
		}
	}
	for i := range e.ranks {
		if t := &e.ranks[i]; !t.acked {
			r.sendAbort(e, t, now)
		}
	}
	if !r.waitsForDrain(reason) {
		r.release(e, PathUnsafe, now) // ranks are told, but nobody waits for them
		return true
	}
	if r.cfg.CanRevoke && r.cfg.EagerRevoke {
		if r.refusalsIsolated(e) {
			r.requestRevoke(e, now)
		} else {
			r.metrics.RevokesAfterDrain++
		}
	}
	r.timers.schedule(e, MinTime)
	return r.checkRelease(e, now)
}

// waitsForDrain says whether an abort for reason waits for its ranks to
// drain (or for its fence or bound) before its memory goes back: always,
// under the core's own policy.
func (r *Receiver) waitsForDrain(reason Reason) bool {
	switch reason {
	case ReasonClientAbort, ReasonDecodeAbort, ReasonLeaseLapsed:
		return r.policy.WaitOnLocalAbort()
	case ReasonSendFailed, ReasonPeerDead, ReasonRejected:
		return r.policy.WaitOnRemoteFailure()
	}
	return true
}

func (r *Receiver) sendAbort(e *exposure, t *rankTrack, now Time) {
	e.lastAbort = now
	// Later than the queued time unless the clock went backwards.
	r.timers.schedule(e, now.Add(r.cfg.AbortRetransmit))
	kind := KindAbort
	if e.rejected {
		kind = KindReject
	}
	r.send(t.rank, Message{Kind: kind, Tag: e.tag, LeaseUntil: t.lease, Reason: e.reason})
}

func (r *Receiver) requestRevoke(e *exposure, now Time) {
	if e.revoking {
		return
	}
	e.revoking = true
	e.revokeAt = now
	r.out.Revokes = append(r.out.Revokes, Revoke{Tag: e.tag})
}

// fenceFirst says whether slots go back only after their keys are revoked
// and the revocation confirmed, whatever the acks say: always when the
// transport can revoke. A rank's DrainAck or Commit is its word; a rank
// that acks and keeps writing (buggy or hostile) would otherwise write into
// memory that another request reuses.
func (r *Receiver) fenceFirst() bool {
	return r.cfg.CanRevoke && r.policy.FenceBeforeRelease()
}

// checkRelease releases an aborting exposure when I3 allows it, and reports
// whether it did.
func (r *Receiver) checkRelease(e *exposure, now Time) bool {
	if e.state != StateAborting {
		return false
	}
	allAcked, deadWriter := true, false
	for i := range e.ranks {
		if t := &e.ranks[i]; !t.acked {
			allAcked = false
			deadWriter = deadWriter || t.dead
		}
	}
	switch {
	case allAcked && !r.fenceFirst():
		r.release(e, PathDrained, now)
		return true
	case allAcked && !e.revoking:
		// Every rank says it drained. Release as drained once the fence
		// confirms it (Revoked).
		r.requestRevoke(e, now)
		return false
	case allAcked:
		// A fence that was asked for and never confirmed: the ranks' word
		// is all there is, so hold to the bound of every writer's lease
		// and tail, as if none had acked.
		return r.releaseAtBound(e, false, PathTimeout, now)
	case r.cfg.CanRevoke && !e.revoking && deadWriter:
		// A dead rank never drains: waiting for the bound only keeps the
		// memory held. Fence now (a fence is safe at any time).
		r.requestRevoke(e, now)
		return false
	}
	return r.releaseAtBound(e, true, PathTimeout, now)
}

// releaseAtBound releases e by path once no write of its ranks (only those
// that did not ack, with unacked) can land any more by time alone: past
// each one's lease + tail + margin, and with a fence, past an unconfirmed
// revoke by the longest tail too. It reports whether it released.
func (r *Receiver) releaseAtBound(e *exposure, unacked bool, path ReleasePath, now Time) bool {
	bound, tail := r.writeBound(e, unacked)
	switch {
	case now < bound:
		return false
	case r.cfg.CanRevoke && !e.revoking:
		// Fence before any timeout release: I1 then holds even against a
		// sender that ignores its lease.
		r.requestRevoke(e, now)
		return false
	case r.cfg.CanRevoke && now < e.revokeAt.Add(tail).Add(r.cfg.ClockMargin):
		// A revoke that was never confirmed: wait out the longest tail of
		// the writers.
		return false
	}
	r.release(e, path, now)
	return true
}

// writeBound is the latest time a write of e's ranks (only those that did
// not ack, with unacked) can land by time alone, and the longest tail among
// them. Every sum saturates: no declared tail can wrap it into the past.
func (r *Receiver) writeBound(e *exposure, unacked bool) (bound Time, tail time.Duration) {
	bound = MinTime
	for i := range e.ranks {
		t := &e.ranks[i]
		if unacked && t.acked {
			continue
		}
		rt := r.Tail(t.rank)
		tail = max(tail, rt)
		d := r.trackLease(e, t).Add(rt).Add(r.cfg.ClockMargin)
		if e.state == StateAborting && !r.policy.BoundAbortsByTail() {
			d = e.stopped.Add(r.cfg.Lease / 8) // "a short fixed timeout"
		}
		bound = max(bound, d)
	}
	return bound, tail
}

func (r *Receiver) release(e *exposure, path ReleasePath, now Time) {
	r.uncoverAll(e)
	var held time.Duration
	switch e.state {
	case StateAssigned:
		r.metrics.AssignedSlots -= len(e.slots)
	case StateAborting:
		r.metrics.HeldSlots -= len(e.slots)
		r.metrics.HeldBytes -= int64(len(e.slots)) * r.cfg.SlotBytes
		held = elapsed(now, e.stopped)
	case StateHanded:
		r.metrics.HandedSlots -= len(e.slots)
	}
	r.metrics.Released[path]++
	r.detachTarget(e)
	r.pool.give(e.slots)
	r.timers.remove(e)
	r.out.Releases = append(r.out.Releases, Release{Tag: e.tag, Slots: e.slots, Path: path, Held: held})
	r.byKey.del(e.tag.Key())
	last := r.list[len(r.list)-1]
	r.list[e.idx] = last
	last.idx = e.idx
	r.list = r.list[:len(r.list)-1]
	r.spare = append(r.spare, e)
}

func (r *Receiver) endQuarantine(path ReleasePath, now Time) {
	if r.quarantine == nil {
		return
	}
	r.metrics.Released[path]++
	r.metrics.QuarantinedSlots = 0
	r.pool.give(r.quarantine)
	r.out.Releases = append(r.out.Releases, Release{Slots: r.quarantine, Path: path, Held: elapsed(now, r.quarantineStart)})
	r.quarantine = nil
}

func (r *Receiver) send(to RankID, m Message) {
	m.Rank = to
	m.Decode = r.cfg.Self
	r.out.Messages = append(r.out.Messages, Envelope{To: to, Msg: m})
}

// lookup finds the exposure a message's tag names. Stale tags (another
// instance, or a generation no longer exposed) find nothing (I4).
func (r *Receiver) lookup(tag Tag) *exposure {
	if tag.Instance != r.cfg.Instance {
		return nil
	}
	return r.byKey.get(tag.Key())
}

// lookupMsg finds the exposure a received message is about.
func (r *Receiver) lookupMsg(tag Tag) *exposure {
	if !r.policy.MatchGenerations() {
		// Match on the room alone, newest first: what a system without
		// generation tags does.
		var best *exposure
		for _, e := range r.list {
			if e.tag.Room == tag.Room && (best == nil || e.tag.Gen > best.tag.Gen) {
				best = e
			}
		}
		return best
	}
	if tag.Instance != r.cfg.Instance {
		return nil
	}
	return r.byKey.get(tag.Key())
}

func (r *Receiver) newExposure() *exposure {
	if n := len(r.spare); n > 0 {
		e := r.spare[n-1]
		r.spare = r.spare[:n-1]
		*e = exposure{slots: e.slots[:0], rankIDs: e.rankIDs[:0], ranks: e.ranks[:0]}
		return e
	}
	return &exposure{}
}

func (e *exposure) allAcked() bool {
	for i := range e.ranks {
		if !e.ranks[i].acked {
			return false
		}
	}
	return true
}

func (e *exposure) track(rank RankID) *rankTrack {
	for i := range e.ranks {
		if e.ranks[i].rank == rank {
			return &e.ranks[i]
		}
	}
	return nil
}
