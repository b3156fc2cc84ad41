package core

import (
	"sort"

	"github.com/kvfence/kvfence/internal/knownunsafe"
)

// BatchStatus is a transport's terminal word on one batch (the sdk contract).
type BatchStatus uint8

const (
	// Succeeded: every byte landed and nothing of the batch can still move.
	Succeeded BatchStatus = iota + 1
	// FailedDefinite: the transport proved nothing more of it will move.
	FailedDefinite
	// InDoubt: it may still move (timeouts, errors under a retrying backend).
	InDoubt
)

func (s BatchStatus) String() string {
	switch s {
	case Succeeded:
		return "succeeded"
	case FailedDefinite:
		return "failed-definite"
	case InDoubt:
		return "in-doubt"
	}
	return "status?"
}

// StreamState is a rank's state for one (tag, decode rank).
type StreamState uint8

const (
	StreamWaiting   StreamState = iota + 1 // assigned; the engine has not opened the request yet
	StreamSending                          // posting under a lease
	StreamCommitted                        // every write succeeded; Commit sent (tombstone)
	StreamFailed                           // a send failed or the lease lapsed; Fail sent; draining on its own
	StreamDraining                         // aborted: unsent pages dropped; waiting for in-flight work
	StreamAcked                            // DrainAck sent (tombstone)
)

var streamNames = [...]string{"?", "waiting", "sending", "committed", "failed", "draining", "acked"}

func (s StreamState) String() string {
	if int(s) >= len(streamNames) {
		return "stream?"
	}
	return streamNames[s]
}

type streamKey struct {
	tag    Tag
	decode RankID
}

type request struct {
	key      RequestKey
	pages    uint32 // pages the engine will produce at most
	ready    uint32 // pages computed so far
	total    uint32 // final page count once finished (may be short: truncation)
	finished bool
	ended    bool // aborted, rejected or closed: no new streams
	rejected bool
	closed   bool
	failed   bool // the engine was told (Failure)
	openedAt Time
	streams  []*stream
	idx      int
}

type stream struct {
	key         streamKey
	state       StreamState
	req         *request
	lease       Time
	slots       []uint32
	posted      uint32
	succeeded   uint32
	unsettled   int
	batches     []*batch // unsettled or uncompleted batches
	everPosted  bool
	anyQuiesced bool
	tombUntil   Time
	idx         int
	queued      bool
}

type batch struct {
	id       BatchID
	st       *stream
	pages    uint32
	done     bool // its one terminal completion arrived
	settled  bool // it can no longer move bytes
	status   BatchStatus
	quiesced bool
	asked    bool // a Quiesce for it was requested
}

// Sender is the core of one prefill rank: it posts writes only under a lease
// decode granted, tracks every batch until it is settled, and says DrainAck
// only when nothing of a tag can still move (I5). It holds a request's source
// pages until then (I7).
type Sender struct {
	cfg       SenderConfig
	streams   map[streamKey]*stream
	list      []*stream
	requests  map[RequestKey]*request
	reqList   []*request // deterministic iteration order
	reqTombs  map[RequestKey]Time
	batches   map[BatchID]*batch
	nextBatch BatchID
	unsettled int
	lastHB    Time
	hbStarted bool
	out       Output
	metrics   SenderMetrics
	peers     []RankID  // scratch for heartbeats
	runq      []*stream // streams that may have pages to post
	runHead   int
	waiting   map[RequestKey][]*stream // assigned before the engine opened the request
}

// NewSender makes the core of one prefill rank.
func NewSender(cfg SenderConfig) (*Sender, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Sender{
		cfg:      cfg,
		streams:  make(map[streamKey]*stream),
		requests: make(map[RequestKey]*request),
		reqTombs: make(map[RequestKey]Time),
		batches:  make(map[BatchID]*batch),
		waiting:  make(map[RequestKey][]*stream),
	}, nil
}

// Ready returns what the last input produced (valid until the next input).
func (s *Sender) Ready() *Output { return &s.out }

// Metrics returns the rank's counters and gauges.
func (s *Sender) Metrics() SenderMetrics {
	m := s.metrics
	m.Unsettled = s.unsettled
	m.Requests = len(s.requests)
	m.Streams, m.Tombstones = 0, 0
	for _, st := range s.list {
		if st.state == StreamCommitted || st.state == StreamAcked {
			m.Tombstones++
		} else {
			m.Streams++
		}
	}
	return m
}

// StreamState reports the state of the stream for (tag, decode).
func (s *Sender) StreamState(tag Tag, decode RankID) (StreamState, bool) {
	st := s.streams[streamKey{tag, decode}]
	if st == nil {
		return 0, false
	}
	return st.state, true
}

// Open starts a request on this rank: the engine will produce up to pages
// pages. Assigns for it (already received or still to come) bind to it.
func (s *Sender) Open(key RequestKey, pages int, now Time) error {
	s.out.reset()
	if pages <= 0 || pages > MaxWireSlots {
		return errorf(ErrInvalidArgument, "request %s: pages %d out of range", key, pages)
	}
	if _, ok := s.requests[key]; ok {
		return errorf(ErrAlreadyExists, "request %s is already open", key)
	}
	if _, ok := s.reqTombs[key]; ok {
		return errorf(ErrFailedPrecondition, "request %s already ended here; use a new generation", key)
	}
	req := &request{key: key, pages: uint32(pages), openedAt: now, idx: len(s.reqList)}
	s.requests[key] = req
	s.reqList = append(s.reqList, req)
	for _, st := range s.waiting[key] {
		if st.state == StreamWaiting {
			s.bind(st, req)
		}
	}
	delete(s.waiting, key)
	s.pump(now)
	return nil
}

func (s *Sender) bind(st *stream, req *request) {
	st.req = req
	st.state = StreamSending
	req.streams = append(req.streams, st)
	s.enqueue(st)
}

// Produce marks pages [0, upto) of a request as computed and sendable.
func (s *Sender) Produce(key RequestKey, upto int, now Time) error {
	s.out.reset()
	req := s.requests[key]
	if req == nil {
		return errorf(ErrNotFound, "request %s is not open", key)
	}
	if upto < 0 || uint32(upto) > req.pages {
		return errorf(ErrInvalidArgument, "request %s: page %d beyond its %d pages", key, upto, req.pages)
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
	req := s.requests[key]
	if req == nil {
		return errorf(ErrNotFound, "request %s is not open", key)
	}
	if total < 0 || uint32(total) > req.pages {
		return errorf(ErrInvalidArgument, "request %s: total %d beyond its %d pages", key, total, req.pages)
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
	for _, st := range req.streams {
		s.maybeCommit(st)
	}
	return nil
}

// Reject refuses a request on prefill (over capacity, too long): every
// decode rank is told with Fail, and the request never hands off.
func (s *Sender) Reject(key RequestKey, now Time) error {
	s.out.reset()
	req := s.requests[key]
	if req == nil {
		return errorf(ErrNotFound, "request %s is not open", key)
	}
	req.rejected = true
	s.endRequest(req, now)
	for _, st := range append([]*stream(nil), req.streams...) {
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
	req := s.requests[key]
	if req == nil {
		// Abort before Open: refuse the request's Assigns from now on, and
		// drain those that already arrived.
		if _, ok := s.reqTombs[key]; !ok {
			s.tombstoneRequest(key, now)
		}
		for _, st := range s.waiting[key] {
			s.drain(st)
		}
		delete(s.waiting, key)
		return nil
	}
	s.cancel(req, ReasonClientAbort, now)
	return nil
}

// cancel ends a request on this rank: every stream drains, and the engine
// is told once.
func (s *Sender) cancel(req *request, reason Reason, now Time) {
	s.endRequest(req, now)
	s.tellFailed(req, reason)
	for _, st := range append([]*stream(nil), req.streams...) {
		s.drain(st)
	}
	s.settleRequest(req)
}

func (s *Sender) tellFailed(req *request, reason Reason) {
	if !req.failed {
		req.failed = true
		s.out.Failures = append(s.out.Failures, Failure{Tag: Tag{Room: req.key.Room, Gen: req.key.Gen}, Reason: reason})
	}
}

// Close is the engine dropping its request object. Holds do not go with it:
// unfinished streams drain, and the source pages come back only through a
// SourceRelease.
func (s *Sender) Close(key RequestKey, now Time) error {
	s.out.reset()
	req := s.requests[key]
	if req == nil {
		return errorf(ErrNotFound, "request %s is not open", key)
	}
	req.closed = true
	s.endRequest(req, now)
	for _, st := range append([]*stream(nil), req.streams...) {
		if st.state == StreamSending {
			s.drain(st)
		}
	}
	s.settleRequest(req)
	return nil
}

func (s *Sender) endRequest(req *request, now Time) {
	if !req.ended {
		req.ended = true
		s.tombstoneRequest(req.key, now)
	}
}

func (s *Sender) tombstoneRequest(key RequestKey, now Time) {
	if s.cfg.Unsafe == knownunsafe.NoTombstones {
		return
	}
	s.reqTombs[key] = now.Add(s.cfg.RequestTombstone)
}

// Step applies one control message from a decode rank (or the router).
func (s *Sender) Step(m Message, now Time) {
	s.out.reset()
	if m.Rank != s.cfg.Rank {
		s.metrics.StaleMessages++
		return
	}
	key := streamKey{m.Tag, m.Decode}
	st := s.streams[key]
	switch m.Kind {
	case KindAssign:
		s.onAssign(key, st, m, now)
	case KindGrant:
		// Only a live lease grows; a lapsed one is never renewed.
		if st != nil && (st.state == StreamSending || st.state == StreamWaiting) &&
			now < st.lease.Add(-s.cfg.SkewMargin) && m.LeaseUntil > st.lease {
			st.lease = m.LeaseUntil
			s.enqueue(st)
		}
	case KindAbort, KindReject:
		s.onAbort(key, st, m, now)
	default:
		s.metrics.StaleMessages++
	}
	if st := s.streams[key]; st != nil && st.req != nil {
		s.settleRequest(st.req)
	}
	s.pump(now)
}

func (s *Sender) onAssign(key streamKey, st *stream, m Message, now Time) {
	if st != nil {
		s.metrics.DuplicateAssigns++ // a tombstone or a live stream: never restart writes
		return
	}
	if len(m.Slots) == 0 {
		s.metrics.StaleMessages++ // an Assign with nothing to write is malformed
		return
	}
	st = s.newStream(key, m.LeaseUntil, now)
	st.slots = append(st.slots[:0], m.Slots...)
	if now >= m.LeaseUntil.Add(-s.cfg.SkewMargin) {
		// A late or duplicated Assign whose lease has passed is refused.
		s.metrics.RefusedAssigns++
		s.fail(st, ReasonLeaseLapsed)
		s.maybeAck(st)
		return
	}
	if _, ended := s.reqTombs[key.tag.Key()]; ended {
		// The request already ended here (abort before assign): nothing
		// will ever be posted for it.
		s.metrics.RefusedAssigns++
		st.state = StreamDraining
		s.maybeAck(st)
		return
	}
	if req := s.requests[key.tag.Key()]; req != nil {
		if req.ended {
			s.metrics.RefusedAssigns++
			st.state = StreamDraining
			s.maybeAck(st)
			return
		}
		s.bind(st, req)
		return
	}
	s.waiting[key.tag.Key()] = append(s.waiting[key.tag.Key()], st)
}

func (s *Sender) onAbort(key streamKey, st *stream, m Message, now Time) {
	// One decode rank giving up dooms the request everywhere (the router
	// needs every rank): end it here too, so its source pages come back
	// even if the router's own cancel is lost.
	if req := s.requests[key.tag.Key()]; req != nil && !req.ended {
		reason := m.Reason
		if reason == ReasonNone {
			reason = ReasonDecodeAbort
		}
		s.cancel(req, reason, now)
	}
	if st == nil {
		// Abort overtook its Assign (or the stream was forgotten): answer
		// with DrainAck and keep a tombstone until the tag's lease is over.
		st = s.newStream(key, m.LeaseUntil, now)
		st.state = StreamDraining
		s.maybeAck(st)
		return
	}
	switch st.state {
	case StreamWaiting, StreamSending, StreamFailed:
		s.drain(st)
	case StreamCommitted:
		st.state = StreamAcked
		s.ack(st, EvidenceCompleted)
	case StreamAcked:
		s.ack(st, s.evidence(st)) // decode may have lost the first one
	}
}

func (s *Sender) newStream(key streamKey, lease Time, now Time) *stream {
	st := &stream{key: key, state: StreamWaiting, lease: lease}
	st.idx = len(s.list)
	s.list = append(s.list, st)
	s.streams[key] = st
	return st
}

// Completed takes a batch's one terminal completion. Anything but Succeeded
// is not completion: the stream fails, and an in-doubt batch must be
// quiesced before the rank may ever say DrainAck.
func (s *Sender) Completed(id BatchID, status BatchStatus, now Time) error {
	s.out.reset()
	b := s.batches[id]
	if b == nil {
		return errorf(ErrNotFound, "batch %d is unknown", id)
	}
	if b.done {
		return errorf(ErrFailedPrecondition, "batch %d already completed", id)
	}
	if status < Succeeded || status > InDoubt {
		return errorf(ErrInvalidArgument, "batch %d: status %d", id, status)
	}
	b.done = true
	b.status = status
	st := b.st
	switch status {
	case Succeeded:
		s.metrics.Succeeded++
		st.succeeded += b.pages
		s.settle(b)
	case FailedDefinite:
		s.metrics.FailedDefinite++
		s.settle(b)
		s.failIfSending(st, ReasonSendFailed)
	case InDoubt:
		s.metrics.InDoubt++
		if s.cfg.Unsafe == knownunsafe.AckAfterFailedSend {
			s.settle(b) // the bug: an error taken as "it stopped"
		}
		s.failIfSending(st, ReasonSendFailed) // quiesces the whole stream
		if !b.settled && !b.asked {
			b.asked = true
			s.out.Quiesces = append(s.out.Quiesces, Quiesce{Decode: st.key.decode, Batches: []BatchID{b.id}})
		}
	}
	s.forget(b)
	s.maybeCommit(st)
	s.maybeAck(st)
	if st.req != nil {
		s.settleRequest(st.req)
	}
	s.pump(now)
	return nil
}

// Quiesced takes the transport's evidence that these batches can no longer
// move bytes.
func (s *Sender) Quiesced(ids []BatchID, ev Evidence, now Time) {
	s.out.reset()
	for _, id := range ids {
		b := s.batches[id]
		if b == nil || b.settled {
			continue
		}
		b.quiesced = true
		b.st.anyQuiesced = true
		s.metrics.Quiesced++
		s.settle(b)
		s.forget(b)
		s.maybeAck(b.st)
		if b.st.req != nil {
			s.settleRequest(b.st.req)
		}
	}
	s.pump(now)
}

func (s *Sender) settle(b *batch) {
	if b.settled {
		return
	}
	b.settled = true
	b.st.unsettled--
	s.unsettled--
}

// forget drops a batch once it is both completed and settled.
func (s *Sender) forget(b *batch) {
	if !b.done || !b.settled {
		return
	}
	delete(s.batches, b.id)
	bs := b.st.batches
	for i, x := range bs {
		if x == b {
			bs[i] = bs[len(bs)-1]
			b.st.batches = bs[:len(bs)-1]
			break
		}
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
	st.state = StreamFailed
	s.metrics.Fails++
	if st.req != nil {
		s.tellFailed(st.req, reason)
	}
	s.dropUnsent(st)
	s.send(st, Message{Kind: KindFail, Reason: reason})
	s.quiesceAll(st)
}

// unwait forgets a stream that was waiting for its request to open.
func (s *Sender) unwait(st *stream) {
	if st.req != nil {
		return
	}
	k := st.key.tag.Key()
	ws := s.waiting[k]
	for i, x := range ws {
		if x == st {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(s.waiting, k)
	} else {
		s.waiting[k] = ws
	}
}

func (s *Sender) drain(st *stream) {
	s.unwait(st)
	if st.state == StreamCommitted || st.state == StreamAcked || st.state == StreamDraining {
		return
	}
	st.state = StreamDraining
	s.dropUnsent(st)
	s.maybeAck(st)
}

func (s *Sender) dropUnsent(st *stream) {
	if n := uint32(len(st.slots)); st.posted < n {
		s.metrics.DroppedPages += uint64(n - st.posted)
		st.posted = n // nothing more will be posted
	}
}

func (s *Sender) quiesceAll(st *stream) {
	var ids []BatchID
	for _, b := range st.batches {
		if !b.settled && !b.asked {
			b.asked = true
			ids = append(ids, b.id)
		}
	}
	if len(ids) > 0 && s.cfg.Unsafe != knownunsafe.AckAfterFailedSend {
		s.out.Quiesces = append(s.out.Quiesces, Quiesce{Decode: st.key.decode, Batches: ids})
	}
}

func (s *Sender) maybeCommit(st *stream) {
	if st.state != StreamSending || st.req == nil || !st.req.finished || st.unsettled > 0 {
		return
	}
	want := st.req.total
	if n := uint32(len(st.slots)); want > n {
		want = n
	}
	if st.posted < want {
		return
	}
	st.state = StreamCommitted
	s.metrics.Commits++
	s.send(st, Message{Kind: KindCommit, Coverage: st.succeeded})
	s.out.Sent = append(s.out.Sent, Sent{Key: st.req.key, Decode: st.key.decode})
	s.entomb(st)
}

// maybeAck sends DrainAck once nothing of the stream can still move (I5).
func (s *Sender) maybeAck(st *stream) {
	if (st.state != StreamFailed && st.state != StreamDraining) || st.unsettled > 0 {
		return
	}
	if s.cfg.Unsafe != knownunsafe.AckAfterFailedSend {
		for _, b := range st.batches {
			if !b.settled {
				return
			}
		}
	}
	st.state = StreamAcked
	s.ack(st, s.evidence(st))
	s.entomb(st)
}

func (s *Sender) evidence(st *stream) Evidence {
	switch {
	case !st.everPosted:
		return EvidenceNothingPosted
	case st.anyQuiesced:
		return EvidenceQuiesced
	}
	return EvidenceCompleted
}

func (s *Sender) ack(st *stream, ev Evidence) {
	s.metrics.DrainAcks++
	s.send(st, Message{Kind: KindDrainAck, Evidence: ev})
}

// entomb keeps a finished stream as a tombstone until its lease is over, so
// a duplicated or late Assign never restarts writes.
func (s *Sender) entomb(st *stream) {
	st.tombUntil = st.lease.Add(s.cfg.SkewMargin)
	if s.cfg.Unsafe == knownunsafe.NoTombstones && st.unsettled == 0 {
		s.remove(st)
	}
}

func (s *Sender) remove(st *stream) {
	delete(s.streams, st.key)
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
	}
}

// settleRequest gives the source pages back once the engine is done with
// the request and none of its streams can still read them (I7).
func (s *Sender) settleRequest(req *request) {
	if !req.ended {
		return
	}
	for _, st := range req.streams {
		if st.unsettled > 0 || (st.state != StreamCommitted && st.state != StreamAcked) {
			return
		}
	}
	if s.requests[req.key] != req {
		return
	}
	delete(s.requests, req.key)
	last := s.reqList[len(s.reqList)-1]
	s.reqList[req.idx] = last
	last.idx = req.idx
	s.reqList = s.reqList[:len(s.reqList)-1]
	s.out.SourceReleases = append(s.out.SourceReleases, SourceRelease{Key: req.key})
}

// Tick advances the rank's timers: lapsed leases stop their streams,
// heartbeats go out, tombstones expire.
func (s *Sender) Tick(now Time) {
	s.out.reset()
	for i := 0; i < len(s.list); i++ {
		st := s.list[i]
		switch st.state {
		case StreamWaiting, StreamSending:
			if now >= st.lease.Add(-s.cfg.SkewMargin) && !s.doneposting(st) {
				s.metrics.LeaseLapses++
				s.fail(st, ReasonLeaseLapsed)
				s.maybeAck(st)
				if st.req != nil {
					s.settleRequest(st.req)
				}
			}
		case StreamCommitted, StreamAcked:
			if now >= st.tombUntil && st.unsettled == 0 && len(st.batches) == 0 {
				s.remove(st)
				i--
			}
		}
	}
	for i := 0; i < len(s.reqList); i++ {
		req := s.reqList[i]
		if !req.ended && len(req.streams) == 0 && now.Sub(req.openedAt) >= s.cfg.BootstrapTimeout {
			n := len(s.reqList)
			s.cancel(req, ReasonBootstrapTimeout, now)
			if len(s.reqList) < n {
				i--
			}
		}
	}
	for k, until := range s.reqTombs {
		if now >= until {
			delete(s.reqTombs, k) // order does not matter: deletes only
		}
	}
	if !s.hbStarted || now.Sub(s.lastHB) >= s.cfg.Heartbeat {
		s.hbStarted = true
		s.lastHB = now
		s.heartbeats(now)
	}
	s.pump(now)
}

func (s *Sender) doneposting(st *stream) bool {
	if st.req == nil || !st.req.finished {
		return false
	}
	want := st.req.total
	if n := uint32(len(st.slots)); want > n {
		want = n
	}
	return st.posted >= want
}

func (s *Sender) heartbeats(now Time) {
	s.peers = s.peers[:0]
	for _, st := range s.list {
		if st.state == StreamCommitted || st.state == StreamAcked {
			continue
		}
		seen := false
		for _, p := range s.peers {
			if p == st.key.decode {
				seen = true
			}
		}
		if !seen {
			s.peers = append(s.peers, st.key.decode)
		}
	}
	for _, p := range s.peers {
		m := Message{Kind: KindHeartbeat, Rank: s.cfg.Rank, Decode: p}
		for _, st := range s.list {
			if st.key.decode != p || st.state == StreamCommitted || st.state == StreamAcked {
				continue
			}
			m.Tags = append(m.Tags, st.key.tag)
			m.Outstanding += uint32(st.unsettled)
			if s.cfg.Unsafe == knownunsafe.SelfRenewedLease && st.state == StreamSending {
				st.lease = now.Add(s.cfg.SelfLease) // the bug: a lease nobody granted
			}
		}
		s.metrics.Heartbeats++
		s.out.Messages = append(s.out.Messages, Envelope{To: p, Msg: m})
	}
}

// pump posts what may be posted: round robin over streams, one batch each
// per round, within the rank's in-flight bound and each stream's lease.
func (s *Sender) pump(now Time) {
	for s.runHead < len(s.runq) && s.unsettled < s.cfg.MaxInflight {
		st := s.runq[s.runHead]
		s.runq[s.runHead] = nil
		s.runHead++
		st.queued = false
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
	if st.state != StreamSending || now >= st.lease.Add(-s.cfg.SkewMargin) {
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
	b := &batch{id: s.nextBatch, st: st, pages: n}
	s.batches[b.id] = b
	st.batches = append(st.batches, b)
	st.unsettled++
	s.unsettled++
	st.everPosted = true
	s.metrics.Posted++
	s.out.Posts = append(s.out.Posts, Post{
		Batch: b.id, Tag: st.key.tag, Decode: st.key.decode,
		FirstPage: st.posted, Slots: st.slots[st.posted : st.posted+n],
	})
	st.posted += n
}

func (s *Sender) send(st *stream, m Message) {
	m.Tag = st.key.tag
	m.Rank = s.cfg.Rank
	m.Decode = st.key.decode
	s.out.Messages = append(s.out.Messages, Envelope{To: st.key.decode, Msg: m})
}

// OpenRequests lists the requests this rank still holds source pages for,
// for inspection (ordered by room, then generation).
func (s *Sender) OpenRequests() []RequestKey {
	keys := make([]RequestKey, 0, len(s.requests))
	for k := range s.requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Room != keys[j].Room {
			return keys[i].Room < keys[j].Room
		}
		return keys[i].Gen < keys[j].Gen
	})
	return keys
}
