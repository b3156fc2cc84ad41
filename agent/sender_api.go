package agent

import (
	"sync"
	"sync/atomic"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// KVSender is prefill's handle on one request (SGLang's BaseKVSender):
// Init reserves source pages, Page gives the memory to fill, Send marks a
// chunk computed, Finish ends production, Poll (or Done) reports, Abort
// cancels, Close gives the handle back. Neither Close nor dropping the
// handle drops a hold: source pages come back only when no posted write
// can still read them.
type KVSender struct {
	p     *Prefill
	key   core.RequestKey
	pages int
	src   []int
	req   *preReq // set by Init: what fills pin (sender_fill.go)
	done  chan struct{}
	// loop-owned
	settled bool
	state   PollState // once settled
	reason  string
	// pub is what Poll reports, stored by the loop at every change
	// (Init, Send, the core's Sent or Failure, the source release): Poll
	// never waits for a turn of the loop.
	pub atomic.Int32
	// fills and writes (sender_fill.go): fillMu is read-held while a step
	// is copied (fills of different pages, e.g. a gather and the aux row's
	// Write, copy at once); Abort and Close take it to wait for them.
	// fillStop, once set, stops every fill before its next step.
	fillMu   sync.RWMutex
	fillStop atomic.Bool
}

// NewSender makes a handle for the request key.
func (p *Prefill) NewSender(key core.RequestKey) *KVSender {
	s := &KVSender{p: p, key: key, done: make(chan struct{})}
	s.pub.Store(int32(PollBootstrapping))
	return s
}

// publish makes st what Poll reports (loop only).
func (s *KVSender) publish(st PollState) {
	if s != nil {
		s.pub.Store(int32(st))
	}
}

// settle records the request's final state and closes done (loop only).
func (s *KVSender) settle(st PollState, reason string) {
	if s == nil || s.settled {
		return
	}
	s.settled, s.state, s.reason = true, st, reason
	close(s.done)
}

// Init reserves source pages and opens the request in the core. Errors are
// classified (errdefs): ResourceExhausted when no source pages are free.
func (s *KVSender) Init(pages int) error {
	var err error
	if !s.p.lp.call(func() {
		if pages <= 0 {
			err = errdefs.Errorf(errdefs.InvalidArgument, "a request has at least one page, got %d", pages)
			return
		}
		if len(s.p.free) < pages {
			err = errdefs.Errorf(errdefs.ResourceExhausted, "%d source pages wanted, %d free", pages, len(s.p.free))
			return
		}
		if err = s.p.core.Open(s.key, pages, now()); err != nil {
			return
		}
		n := len(s.p.free) - pages
		s.src = append([]int(nil), s.p.free[n:]...)
		s.p.free = s.p.free[:n]
		s.pages = pages
		s.req = &preReq{key: s.key, src: s.src, state: PollBootstrapping, snd: s}
		s.p.reqs[s.key] = s.req
		s.p.act()
	}) {
		return errClosed
	}
	return err
}

// Page is the source memory of page i (one shard): the engine writes the
// page's KV here before Send covers it. It is the engine's until Close or
// Abort; after them the runtime may hand it to another request.
func (s *KVSender) Page(i int) []byte {
	b := s.p.src.Bytes()
	off := int64(s.src[i]) * s.p.cfg.ShardBytes
	return b[off : off+s.p.cfg.ShardBytes : off+s.p.cfg.ShardBytes]
}

// Pages is how many pages Init reserved.
func (s *KVSender) Pages() int { return s.pages }

// Send marks pages [0, upto) as computed and sendable.
func (s *KVSender) Send(upto int) error {
	var err error
	s.p.lp.call(func() {
		if r := s.p.reqs[s.key]; r != nil && r.state == PollBootstrapping {
			r.state = PollTransferring
			r.snd.publish(PollTransferring)
		}
		if err = s.p.core.Produce(s.key, upto, now()); err == nil {
			s.p.act()
		}
	})
	return err
}

// Finish says the request produced its last page (total pages in all).
func (s *KVSender) Finish(total int) error {
	var err error
	s.p.lp.call(func() {
		if err = s.p.core.Finish(s.key, total, now()); err == nil {
			s.p.act()
		}
	})
	return err
}

// Poll reports the request's state; Failed once the agent closed. It
// never waits for the agent's loop: it reads what the loop published.
func (s *KVSender) Poll() PollState {
	if s.p.lp.stopped() {
		return PollFailed
	}
	return PollState(s.pub.Load())
}

// pollInLoop is Poll computed from the agent's tables (loop only): the
// reference the published state is tested against.
func (s *KVSender) pollInLoop() PollState {
	switch r := s.p.reqs[s.key]; {
	case r != nil && r.snd == s:
		return r.state
	case s.settled:
		return s.state
	case s.src != nil:
		return PollFailed // closed or aborted before it ended
	}
	return PollBootstrapping
}

// Done is closed when the request reaches Success or Failed.
func (s *KVSender) Done() <-chan struct{} { return s.done }

// Err says why a failed request failed (nil otherwise), classified
// Unavailable.
func (s *KVSender) Err() error {
	var reason string
	var failed bool
	s.p.lp.call(func() { failed, reason = s.settled && s.state == PollFailed, s.reason })
	if !failed {
		return nil
	}
	return errdefs.Errorf(errdefs.Unavailable, "request %d/%d failed: %s", s.key.Room, s.key.Gen, reason)
}

// Abort cancels the request here: unsent pages are dropped, in-flight work
// drains, and the handle is closed. It returns once no Fill of the handle
// writes any more (not to be called from a Fill's callback).
func (s *KVSender) Abort() {
	s.p.lp.call(func() {
		if s.p.core.Abort(s.key, now()) == nil {
			s.p.act()
		}
		s.close()
	})
	s.stopFills()
}

// Close gives the handle back once the engine is done with it (SGLang's
// clear): its source pages return when no posted write can still read
// them, not before. Like Abort, it returns once no Fill writes any more.
func (s *KVSender) Close() {
	s.p.lp.call(s.close)
	s.stopFills()
}

func (s *KVSender) close() {
	s.fillStop.Store(true)
	if r := s.p.reqs[s.key]; r != nil && r.snd == s && !r.closed {
		r.closed = true
		if s.p.core.Close(s.key, now()) == nil {
			s.p.act()
		}
	}
}

func (p *Prefill) accept(h peerHello) (peerHello, error) {
	if h.Role != RoleRouter || p.cfg.commands == nil {
		return peerHello{}, errdefs.Errorf(errdefs.FailedPrecondition, "prefill rank %d takes no links from %q", p.cfg.Rank, h.Role)
	}
	if h.Version != ControlVersion {
		return peerHello{}, errdefs.Errorf(errdefs.FailedPrecondition, "incompatible router: speaks control protocol v%d, prefill speaks v%d", h.Version, ControlVersion)
	}
	return p.hello, nil
}
