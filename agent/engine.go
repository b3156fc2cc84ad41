package agent

import (
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/core"
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
	return [...]string{"Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"}[s]
}

// KVReceiver is decode's handle on one request (SGLang's BaseKVReceiver):
// Init exposes slots, Poll reports progress, Abort stops it. Dropping the
// handle (or calling Clear) never releases memory: the hold lives in the
// agent until drained, fenced or timeout.
type KVReceiver struct {
	d         *Decode
	key       core.RequestKey
	tag       core.Tag
	decodeFor time.Duration // <0: the engine calls Finish itself
	onDone    func(RequestOutcome)
	reported  bool // loop-owned
	handed    bool // loop-owned: how it was reported
	released  atomic.Bool
}

// NewReceiver makes a handle for the request key (room, generation).
func (d *Decode) NewReceiver(key core.RequestKey) *KVReceiver {
	return &KVReceiver{d: d, key: key, decodeFor: -1}
}

// Init exposes pages slots that every rank in ranks will write.
func (r *KVReceiver) Init(pages int, ranks []core.RankID) (core.Tag, error) {
	var err error
	if !r.d.lp.call(func() { r.tag, err = r.d.admit(r.key, pages, ranks, r) }) {
		return core.Tag{}, errClosed
	}
	return r.tag, err
}

// Poll reports the request's state.
func (r *KVReceiver) Poll() PollState {
	st := PollBootstrapping
	r.d.lp.call(func() {
		if dt := r.d.tags[r.key]; dt != nil && dt.tag == r.tag {
			st = dt.state
		} else if r.tag != (core.Tag{}) {
			st = PollFailed // released without handoff, or finished: nothing to read
			if r.handed {
				st = PollSuccess
			}
		}
	})
	return st
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

// Finish tells the agent the decode loop is done with a handed-off request.
func (r *KVReceiver) Finish() { r.d.lp.call(func() { r.d.finish(r.tag) }) }

// Released reports whether the agent gave the request's slots back.
func (r *KVReceiver) Released() bool { return r.released.Load() }

// Clear drops the handle. Nothing is released by it.
func (r *KVReceiver) Clear() { r.onDone = nil }
