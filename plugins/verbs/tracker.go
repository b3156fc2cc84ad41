package verbs

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// epoch is the accounting of one queue pair's life, from creation to
// destruction: which work requests are posted and not yet harvested, which
// batch each belongs to, and what the batch's terminal status is. It is pure
// logic (no cgo, no locking: the transport holds its lock around calls), so
// the mapping of work completions onto the contract is unit-tested on any
// machine.
//
// Selective signalling: only the last work request of a batch is posted
// signalled. The send queue of an RC QP completes in order, so a work
// completion for request X retires every request posted on the QP before X
// that is not yet retired, whether or not it produced a completion itself:
//
//   - X succeeded, or X failed with a non-flush error: the requests before X
//     all succeeded (an error completion is always generated, signalled or
//     not, and it is the first failure of the queue);
//   - X was flushed: the requests before X with no completion of their own
//     either succeeded silently or were flushed silently (devices differ on
//     whether unsignalled flushed requests report): their fate is unknown,
//     so they count as flushed and their bytes are not counted as landed.
//
// Because each batch's last request is signalled and completions come in
// order, the requests retired this way always belong to the batch of X, and
// the send-queue slots they held are free again: outstanding counts posted
// requests not yet retired, which is what the send queue holds.
type epoch struct {
	outstanding int      // work requests posted and not retired
	order       []uint64 // ids of posted, not retired work requests, in post (= completion) order
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
// posted, in that order, after every request added before. partial says
// that the batch had more operations that were never posted (ibv_post_send
// refused the rest of the chain): they cannot move. The last of wrIDs must
// be signalled (or be followed by signalled requests), or the batch waits
// for a later completion or a flush.
func (e *epoch) add(id sdk.BatchID, wrIDs []uint64, bytes []uint64, total uint64, partial bool) {
	b := &batchAcct{pending: len(wrIDs), total: total, partial: partial}
	e.batches[id] = b
	for i, w := range wrIDs {
		e.wrs[w] = wrRef{batch: id, bytes: bytes[i]}
	}
	e.order = append(e.order, wrIDs...)
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

// harvest applies one work completion, for wrID and (see epoch) for every
// request posted before it and not yet retired, and returns the completions
// that are now terminal. Unknown work request ids (already retired, or from
// another epoch) are ignored and reported by ok=false.
func (e *epoch) harvest(wrID uint64, st WCStatus) (out []sdk.Completion, ok bool) {
	if _, found := e.wrs[wrID]; !found {
		return nil, false
	}
	implied := WCSuccess
	if st == WCWRFlushErr {
		implied = WCWRFlushErr // succeeded or flushed silently: not known to have landed
	}
	for len(e.order) > 0 {
		w := e.order[0]
		e.order = e.order[1:]
		if w == wrID {
			break
		}
		if _, live := e.wrs[w]; live {
			out = append(out, e.retire(w, implied)...)
		}
	}
	if len(e.order) == 0 {
		e.order = nil // let the backing array go
	}
	return append(out, e.retire(wrID, st)...), true
}

// retire applies status st to the live work request wrID.
func (e *epoch) retire(wrID uint64, st WCStatus) (out []sdk.Completion) {
	ref := e.wrs[wrID]
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
	return out
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
			Class: errdefs.ResourceExhausted, Detail: "part of the batch was refused by ibv_post_send and never posted"}, true
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
			Class: errdefs.Unavailable, Detail: fmt.Sprintf("queue pair moved to ERROR by the plugin and drained (first status %v)", b.first)})
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
			Class: errdefs.Unavailable, Detail: why})
	}
	e.wrs = map[uint64]wrRef{}
	e.order = nil
	e.outstanding = 0
	return out
}
