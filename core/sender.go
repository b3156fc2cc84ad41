package core

import (
	"sort"
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

// tombstone is what remains of a finished stream until its lease is over:
// enough to ignore a late Assign and to answer a late Abort.
type tombstone struct {
	until    Time
	state    StreamState // committed or acked
	evidence DrainEvidence
}

type request struct {
	key       RequestKey
	pages     uint32 // pages the engine will produce at most
	ready     uint32 // pages computed so far
	total     uint32 // final page count once finished (may be short: truncation)
	finished  bool
	ended     bool // aborted, rejected or closed: no new streams
	rejected  bool
	closed    bool
	failed    bool // the engine was told (Failure)
	openedAt  Time
	streams   []*stream // live streams only
	idx       int
	timerSlot // in Sender.bootTimers while the bootstrap timeout may apply
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
	batches     []*batch // batches not yet both completed and settled
	everPosted  bool
	anyQuiesced bool
	idx         int
	queued      bool
	timerSlot   // in Sender.leaseTimers while it may lapse
	// Heartbeat session (sender_lease.go).
	peer      *peerLease
	holdUntil Time   // from Assign: no lease of the tag passes it
	listed    bool   // in the listed set: may still post
	listedSeq uint64 // the first heartbeat that listed it; 0 until sent
	excluded  bool   // decode said no rank lease covers it
}

type batch struct {
	id       BatchID
	st       *stream // nil once its stream became a tombstone
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
// pages until then (I7). Finished streams shrink to tombstones; the structs
// behind streams, batches and requests are reused, so the steady state does
// not allocate.
type Sender struct {
	cfg    SenderConfig
	policy policy // the rules a known-unsafe variant may change (policy.go)
	// recs: per request key, its request, streams and tombstones
	// (sender_tags.go).
	recs      keyIndex[*tagRec]
	list      []*stream  // live streams, in a deterministic order
	reqList   []*request // open requests, in a deterministic order
	nTombs    int        // stream tombstones
	batches   map[BatchID]*batch
	nextBatch BatchID
	unsettled int
	runq      []*stream // streams that may have pages to post
	runHead   int
	lastHB    Time
	hbStarted bool

	// Timers: a Tick looks only at entries that are due (timerheap.go).
	leaseTimers   deadlines[*stream]    // a stream's lease minus the skew margin
	bootTimers    deadlines[*request]   // a request's bootstrap timeout
	tombTimers    timerHeap[streamKey]  // a stream tombstone's end
	reqTombTimers timerHeap[RequestKey] // a request tombstone's end
	dueStreams    []*stream             // scratch for Tick
	dueReqs       []*request            // scratch for Tick
	out           Output
	metrics       SenderMetrics

	peerByRank  map[RankID]*peerLease // heartbeat sessions (sender_lease.go)
	peerList    []*peerLease          // the same, in a deterministic order
	scratch     []*stream             // scratch for loops that change req.streams
	freeStreams []*stream
	freeBatches []*batch
	freeReqs    []*request
	freeRecs    []*tagRec
}

// NewSender makes the core of one prefill rank.
func NewSender(cfg SenderConfig) (*Sender, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pol, err := policyFor(cfg.Unsafe)
	if err != nil {
		return nil, err
	}
	s := &Sender{
		cfg:     cfg,
		policy:  pol,
		recs:    keyIndex[*tagRec]{seed: processSeed ^ cfg.Session},
		batches: make(map[BatchID]*batch),
	}
	s.bootTimers.widen(cfg.BootstrapTimeout)
	return s, nil
}

// Ready returns what the last input produced (valid until the next input).
func (s *Sender) Ready() *Output { return &s.out }

// Metrics returns the rank's counters and gauges.
func (s *Sender) Metrics() SenderMetrics {
	m := s.metrics
	m.Unsettled = s.unsettled
	m.Requests = len(s.reqList)
	m.Streams = len(s.list)
	m.Tombstones = s.nTombs
	return m
}

// StreamState reports the state of the stream for (tag, decode), live or
// tombstone.
func (s *Sender) StreamState(tag Tag, decode RankID) (StreamState, bool) {
	k := streamKey{tag, decode}
	if st := s.stream(k); st != nil {
		return st.state, true
	}
	if tb, ok := s.tomb(k); ok {
		return tb.state, true
	}
	return 0, false
}

// OpenRequests lists the requests this rank still holds source pages for,
// for inspection (ordered by room, then generation).
func (s *Sender) OpenRequests() []RequestKey {
	keys := make([]RequestKey, 0, len(s.reqList))
	for _, req := range s.reqList {
		keys = append(keys, req.key)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Room != keys[j].Room {
			return keys[i].Room < keys[j].Room
		}
		return keys[i].Gen < keys[j].Gen
	})
	return keys
}
