package agent

import (
	"sync/atomic"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// PollState is what an engine sees when it polls a request, with SGLang's
// KVPoll values so connector code maps one to one.
type PollState int

const (
	PollFailed          PollState = 0
	PollBootstrapping   PollState = 1 // created, not yet admitted (decode) or assigned (prefill)
	PollWaitingForInput PollState = 2 // decode: slots exposed, nothing heard yet; prefill: assigned, no pages yet
	PollTransferring    PollState = 3
	PollSuccess         PollState = 4
)

func (s PollState) String() string {
	if s < PollFailed || s > PollSuccess {
		return "PollState(?)"
	}
	return [...]string{"Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"}[s]
}

// Final reports whether a request in state s will not change state again.
func (s PollState) Final() bool { return s == PollFailed || s == PollSuccess }

// KVReceiver is decode's handle on one request (SGLang's BaseKVReceiver):
// Init exposes slots, Poll (or Done) reports progress, Pages reads a
// handed-off request, Finish gives it back, Abort stops it. Dropping the
// handle never releases memory: the hold lives in the agent until drained,
// fenced or timeout. (SGLang's receiver clear() is that drop: the C ABI's
// kvfence_close; nothing in Go needs a method for it.)
type KVReceiver struct {
	d        *Decode
	key      core.RequestKey
	tag      core.Tag
	done     chan struct{}
	settled  bool   // loop-owned: done is closed
	handed   bool   // loop-owned: handed off (Poll stays Success after Finish)
	reason   string // loop-owned: why it failed
	released atomic.Bool
	// pub is what Poll reports, stored by the loop at every change of
	// the request's state (admit, noteStarted, handoff, release): Poll
	// reads it without waiting for a turn of the loop, which may be
	// busy with a fill piece or preempted on a loaded host.
	pub atomic.Int32
	// pages is the slot memory of the handed-off request, stored by the
	// loop at handoff and cleared at release (before the slots are
	// scrubbed or go back): Pages reads it without a turn of the loop
	// (that round trip cost decode's poll at handoff ~50-80 µs per C ABI
	// call on a loaded host). The core keeps a handed-off request's slots
	// until release, so the pointer is set exactly while the loop's
	// tables would give the same answer.
	pages atomic.Pointer[[][]byte]
}

// NewReceiver makes a handle for the request key (room, generation).
func (d *Decode) NewReceiver(key core.RequestKey) *KVReceiver {
	r := &KVReceiver{d: d, key: key, done: make(chan struct{})}
	r.pub.Store(int32(PollBootstrapping))
	return r
}

// publish makes st what Poll reports (loop only).
func (r *KVReceiver) publish(st PollState) {
	if r != nil {
		r.pub.Store(int32(st))
	}
}

// settle closes done once the request is handed off or failed (loop only).
func (r *KVReceiver) settle() {
	if !r.settled {
		r.settled = true
		close(r.done)
	}
}

// Init exposes pages slots that every rank in ranks will write. Errors are
// classified (errdefs): ResourceExhausted when the pool is full (holds
// count), AlreadyExists for a live key, InvalidArgument for bad sizes.
func (r *KVReceiver) Init(pages int, ranks []core.RankID) (core.Tag, error) {
	var err error
	if !r.d.lp.call(func() { r.tag, err = r.d.admit(r.key, pages, nil, ranks, r) }) {
		return core.Tag{}, errClosed
	}
	return r.tag, err
}

// Tag is the exposure Init made (zero before).
func (r *KVReceiver) Tag() core.Tag { return r.tag }

// Poll reports the request's state; Failed once the agent closed (nothing
// will ever move the request again, so a caller must not wait on it). It
// never waits for the agent's loop: it reads what the loop published.
func (r *KVReceiver) Poll() PollState {
	if r.d.lp.stopped() {
		return PollFailed
	}
	return PollState(r.pub.Load())
}

// pollInLoop is Poll computed from the agent's tables (loop only): the
// reference the published state is tested against.
func (r *KVReceiver) pollInLoop() PollState {
	if dt := r.d.tags[r.key]; dt != nil && dt.tag == r.tag {
		return dt.state
	}
	if r.tag == (core.Tag{}) {
		return PollBootstrapping
	}
	if r.handed {
		return PollSuccess
	}
	return PollFailed // released without handoff: nothing to read
}

// Done is closed when the request reaches Success or Failed.
func (r *KVReceiver) Done() <-chan struct{} { return r.done }

// Err says why a failed request failed (nil otherwise), classified
// Unavailable: the transfer did not complete, and nothing about its memory
// follows from it (the hold stays until it is safe).
func (r *KVReceiver) Err() error {
	var reason string
	r.d.lp.call(func() {
		if r.settled && !r.handed {
			reason = r.reason
			if reason == "" {
				reason = "released without handoff"
			}
		}
	})
	if reason == "" {
		return nil
	}
	return errdefs.Errorf(errdefs.Unavailable, "request %d/%d failed: %s", r.key.Room, r.key.Gen, reason)
}

// Pages gives the slot memory of every page of a handed-off request (each
// page holds one shard per tensor-parallel rank, in the order of the ranks
// given to Init). The memory is the engine's to read until Finish; nil when
// the request is not handed off. In direct mode an engine page without a
// host view is a nil entry (the engine reads its own page); host landing
// pages (EngineMemory.HostPages) always have their bytes.
func (r *KVReceiver) Pages() [][]byte {
	if r.d.lp.stopped() {
		return nil // as a loop call after Close: the memory may be going
	}
	if p := r.pages.Load(); p != nil {
		return *p
	}
	return nil
}

// pagesInLoop is Pages computed from the agent's tables (loop only): the
// reference the published pages are tested against.
func (r *KVReceiver) pagesInLoop() [][]byte {
	dt := r.d.tags[r.key]
	if dt == nil || dt.tag != r.tag || dt.state != PollSuccess {
		return nil
	}
	var pages [][]byte
	for _, s := range dt.slots {
		pages = append(pages, r.d.slotMem(s))
	}
	return pages
}

// Abort stops the request; its memory stays held until it is safe.
func (r *KVReceiver) Abort() {
	r.d.lp.call(func() {
		if dt := r.d.tags[r.key]; dt != nil && dt.tag == r.tag && dt.state != PollSuccess {
			_ = r.d.core.Abort(r.tag, core.ReasonClientAbort, now())
			r.d.act()
		}
	})
}

// Finish tells the agent the decode loop is done with a handed-off request:
// its pages are checked once more (with a ContentCheck) and its slots go back.
func (r *KVReceiver) Finish() { r.d.lp.call(func() { r.d.finish(r.tag) }) }

// Released reports whether the agent gave the request's slots back.
func (r *KVReceiver) Released() bool { return r.released.Load() }
