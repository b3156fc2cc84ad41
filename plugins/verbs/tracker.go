package verbs

import (
	"fmt"

	"github.com/kvfence/kvfence/sdk"
)

// epoch is the accounting of one queue pair's life, from creation to
// destruction: which work requests are posted and not yet harvested, which
// batch each belongs to, and what the batch's terminal status is. It is pure
// logic (no cgo, no locking: the transport holds its lock around calls), so
// the mapping of work completions onto the contract is unit-tested on any
// machine.
type epoch struct {
	outstanding int // work requests posted and not harvested
	wrs         map[uint64]wrRef
	batches     map[sdk.BatchID]*batchAcct
	// hwError: a non-success, non-flush completion arrived: the device moved
	// the QP to ERROR itself, and bytes may still be in flight (retries,
	// packets in the fabric) as far as we can prove.
	hwError bool
	// flushing: the plugin moved the QP to ERROR itself (Quiesce/Close).
	flushing bool
}

type wrRef struct {
	batch sdk.BatchID
	bytes uint64
}

type batchAcct struct {
	pending int    // work requests of the batch not yet harvested
	landed  uint64 // bytes of successful work requests
	total   uint64
	first   WCStatus // first non-success status (WCSuccess if none)
	partial bool     // some work requests of the batch were never posted
	held    bool     // finished while flushing: completion waits for the drain
}

func newEpoch() *epoch {
	return &epoch{wrs: map[uint64]wrRef{}, batches: map[sdk.BatchID]*batchAcct{}}
}

// add records a batch whose work requests wrIDs (with their byte counts) were
// posted. partial says that the batch had more operations that were never
// posted (ibv_post_send refused the rest of the chain): they cannot move.
func (e *epoch) add(id sdk.BatchID, wrIDs []uint64, bytes []uint64, total uint64, partial bool) {
	b := &batchAcct{pending: len(wrIDs), total: total, partial: partial}
	e.batches[id] = b
	for i, w := range wrIDs {
		e.wrs[w] = wrRef{batch: id, bytes: bytes[i]}
	}
	e.outstanding += len(wrIDs)
}

// pending reports whether batch id is tracked and has no completion yet.
func (e *epoch) pending(id sdk.BatchID) bool { _, ok := e.batches[id]; return ok }

// pendingIDs lists the batches that have no completion yet.
func (e *epoch) pendingIDs() []sdk.BatchID {
	ids := make([]sdk.BatchID, 0, len(e.batches))
	for id := range e.batches {
		ids = append(ids, id)
	}
	return ids
}

// harvest applies one work completion and returns the completions that are
// now terminal. Unknown work request ids (already harvested, or from another
// epoch) are ignored and reported by ok=false.
func (e *epoch) harvest(wrID uint64, st WCStatus) (out []sdk.Completion, ok bool) {
	ref, found := e.wrs[wrID]
	if !found {
		return nil, false
	}
	delete(e.wrs, wrID)
	e.outstanding--
	b := e.batches[ref.batch]
	b.pending--
	if st == WCSuccess {
		b.landed += ref.bytes
	} else {
		if b.first == WCSuccess {
			b.first = st
		}
		if st != WCWRFlushErr {
			e.hwError = true
		}
	}
	if b.pending == 0 {
		if c, done := e.decide(ref.batch, b); done {
			out = append(out, c)
		}
	}
	if e.flushing && e.outstanding == 0 {
		out = append(out, e.releaseHeld()...)
	}
	return out, true
}

// decide maps a batch whose work requests are all harvested onto the
// contract. done=false: held until the QP is drained (plugin-initiated flush).
func (e *epoch) decide(id sdk.BatchID, b *batchAcct) (sdk.Completion, bool) {
	switch {
	case b.first == WCSuccess && !b.partial:
		delete(e.batches, id)
		return sdk.Completion{Batch: id, Status: sdk.Succeeded, BytesLanded: b.landed}, true
	case b.first == WCSuccess && b.partial:
		// Every posted request succeeded and is done; the rest never left.
		delete(e.batches, id)
		return sdk.Completion{Batch: id, Status: sdk.FailedDefinite, BytesLanded: b.landed,
			Class: sdk.ClassResourceExhausted, Detail: "part of the batch was refused by ibv_post_send and never posted"}, true
	case e.flushing:
		b.held = true
		return sdk.Completion{}, false
	}
	delete(e.batches, id)
	return sdk.Completion{Batch: id, Status: sdk.InDoubt, BytesLanded: b.landed, Class: b.first.class(),
		Detail: fmt.Sprintf("work completion %v: in doubt until the queue pair is quiesced", b.first)}, true
}

// beginFlush records that the plugin is moving the QP to ERROR itself; from
// now on every completion is a step of the drain. Returns the completions
// that are terminal at once (the QP was already drained).
func (e *epoch) beginFlush() []sdk.Completion {
	e.flushing = true
	if e.outstanding == 0 {
		return e.releaseHeld()
	}
	return nil
}

// drained: the QP is in ERROR by our hand and every posted work request has
// completed (successfully or flushed): nothing posted on it can move.
func (e *epoch) drained() bool { return e.flushing && e.outstanding == 0 }

// releaseHeld ends the batches held during a plugin-initiated flush: the
// QP is in ERROR and drained, so what did not succeed is FailedDefinite.
func (e *epoch) releaseHeld() []sdk.Completion {
	var out []sdk.Completion
	for id, b := range e.batches {
		if !b.held {
			continue
		}
		delete(e.batches, id)
		out = append(out, sdk.Completion{Batch: id, Status: sdk.FailedDefinite, BytesLanded: b.landed,
			Class: sdk.ClassUnavailable, Detail: fmt.Sprintf("queue pair moved to ERROR by the plugin and drained (first status %v)", b.first)})
	}
	return out
}

// abandon ends every batch without a completion as InDoubt (Close, or a
// device failure that stops the drain): nothing proves they stopped.
func (e *epoch) abandon(why string) []sdk.Completion {
	var out []sdk.Completion
	for id, b := range e.batches {
		delete(e.batches, id)
		out = append(out, sdk.Completion{Batch: id, Status: sdk.InDoubt, BytesLanded: b.landed,
			Class: sdk.ClassUnavailable, Detail: why})
	}
	e.wrs = map[uint64]wrRef{}
	e.outstanding = 0
	return out
}
