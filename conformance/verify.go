package conformance

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvfence/kvfence/sdk"
)

// Every Succeeded the suite sees, in every group, is checked against the
// target's memory the moment it arrives, before any check can see it: a
// plugin that reports Succeeded before its bytes land is caught wherever it
// does so, not only where a check happens to look (the performance group
// and the soak read no memory of their own). The session records each
// batch's ops as it is posted and each key's window as it is granted; the
// collector compares the target's bytes with the source's for every op of
// a Succeeded batch. Source memory never changes after setup, so two
// writes to the same target bytes from the same source offsets carry the
// same bytes; a mismatch where another batch wrote the same target bytes
// from other source bytes is inconclusive (counted, not failed).

// ledger is what the session knows about its batches and keys.
type ledger struct {
	mu     sync.Mutex
	keys   map[sdk.Key]sdk.Window // granted at the target
	posted map[sdk.BatchID][]sdk.Op
	order  []sdk.BatchID // post order, for the overlap test
	lies   map[sdk.BatchID]error
	// seq orders posts and Succeeded arrivals: a batch that was Succeeded
	// before another was posted moves nothing more (its own check saw to
	// that), so it cannot have overwritten the later one's bytes.
	seq              int
	postSeq, doneSeq map[sdk.BatchID]int
}

func newLedger() *ledger {
	return &ledger{keys: map[sdk.Key]sdk.Window{}, posted: map[sdk.BatchID][]sdk.Op{}, lies: map[sdk.BatchID]error{},
		postSeq: map[sdk.BatchID]int{}, doneSeq: map[sdk.BatchID]int{}}
}

// recordingTransport is the initiator's transport with every accepted
// batch's ops recorded.
type recordingTransport struct {
	sdk.Transport
	l *ledger
}

func (r recordingTransport) Post(ctx context.Context, b sdk.Batch) error {
	r.l.mu.Lock()
	if _, dup := r.l.posted[b.ID]; !dup {
		r.l.posted[b.ID] = append([]sdk.Op(nil), b.Ops...)
		r.l.order = append(r.l.order, b.ID)
		r.l.seq++
		r.l.postSeq[b.ID] = r.l.seq
	}
	r.l.mu.Unlock()
	return r.Transport.Post(ctx, b)
}

// recordingGranter is the target's granter with every key's window
// recorded.
type recordingGranter struct {
	sdk.Granter
	l *ledger
}

func (r recordingGranter) Grant(ctx context.Context, w sdk.Window) (sdk.Key, error) {
	k, err := r.Granter.Grant(ctx, w)
	if err == nil {
		r.l.mu.Lock()
		r.l.keys[k] = w
		r.l.mu.Unlock()
	}
	return k, err
}

// verify checks a Succeeded completion of the session against target
// memory and records a lie when bytes are missing.
func (se *session) verify(c sdk.Completion) {
	l := se.ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	l.doneSeq[c.Batch] = l.seq
	ops, ok := l.posted[c.Batch]
	if !ok {
		se.s.counted(false)
		return
	}
	src := se.src.Bytes()
	for i, op := range ops {
		w, ok := l.keys[op.RemoteKey]
		if !ok || w.Region != se.dstID || op.LocalRegion != se.srcID {
			se.s.counted(false)
			return
		}
		at := w.Offset + op.RemoteOffset
		if at+op.Length > se.size || at+op.Length < at || op.LocalOffset+op.Length > uint64(len(src)) {
			se.s.counted(false)
			return
		}
		if err := mismatch(se.dst.read(at, op.Length), src[op.LocalOffset:op.LocalOffset+op.Length]); err != nil {
			if l.overwritten(c.Batch, w.Region, at, op) {
				se.s.counted(false)
				return
			}
			l.lies[c.Batch] = se.s.noteLie(broke(PromiseSucceeded, fmt.Errorf("batch %d reported Succeeded, but op %d's bytes are not at the target when the completion arrives ([%d,+%d) of the target region: %v)", c.Batch, i, at, op.Length, err)))
			return
		}
	}
	se.s.counted(true)
}

// overwritten says whether another batch that may still have been moving
// bytes while self was in flight wrote into [at,+op.Length) of region from
// other source bytes (then the comparison proves nothing). Called with
// l.mu held.
func (l *ledger) overwritten(self sdk.BatchID, region sdk.RegionID, at uint64, op sdk.Op) bool {
	for _, id := range l.order {
		if d, ok := l.doneSeq[id]; id == self || ok && d < l.postSeq[self] && l.lies[id] == nil {
			continue
		}
		for _, o := range l.posted[id] {
			w, ok := l.keys[o.RemoteKey]
			if !ok || w.Region != region {
				continue
			}
			oat := w.Offset + o.RemoteOffset
			if oat < at+op.Length && at < oat+o.Length && int64(oat)-int64(o.LocalOffset) != int64(at)-int64(op.LocalOffset) {
				return true
			}
		}
	}
	return false
}

// lie is the broken promise recorded for a batch, or nil.
func (se *session) lie(id sdk.BatchID) error {
	se.ledger.mu.Lock()
	defer se.ledger.mu.Unlock()
	return se.ledger.lies[id]
}

// verdicts is the suite-wide account of the Succeeded checks.
type verdicts struct {
	mu      sync.Mutex
	lies    []error
	checked uint64 // Succeeded batches whose every byte was compared
	blind   uint64 // Succeeded batches the suite could not compare (another region, overwritten)
}

func (s *suite) noteLie(err error) error {
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	s.verdicts.lies = append(s.verdicts.lies, err)
	return err
}

func (s *suite) counted(checked bool) {
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	if checked {
		s.verdicts.checked++
	} else {
		s.verdicts.blind++
	}
}

// liesSince is the first lie recorded after the first n, and how many
// there are now.
func (s *suite) liesSince(n int) (error, int) {
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	if len(s.verdicts.lies) > n {
		return s.verdicts.lies[n], len(s.verdicts.lies)
	}
	return nil, len(s.verdicts.lies)
}

// succeededCounts is how many Succeeded the suite could not and could
// compare so far.
func (s *suite) succeededCounts() (blind, checked uint64) {
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	return s.verdicts.blind, s.verdicts.checked
}
