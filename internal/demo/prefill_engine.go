package demo

import (
	"sync"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/internal/routerlink"
)

// PrefillEngine is the simulated engine behind a prefill agent: for each
// request the router opens it computes one page every PageEvery, filling it
// with the content oracle's bytes for this rank, and sends it; it aborts
// what the router cancels. It uses the runtime's public API only.
type PrefillEngine struct {
	rank  uint32
	ready chan struct{}
	quit  chan struct{}
	once  sync.Once
	p     *agent.Prefill
	mu    sync.Mutex
	reqs  map[core.RequestKey]*prefillReq
}

// prefillReq is one request's handle and the lock that keeps the engine
// from writing its source pages once it gave them back.
type prefillReq struct {
	mu     sync.Mutex
	s      *agent.KVSender
	closed bool // aborted or closed: its pages may belong to another request
}

// NewPrefillEngine makes the engine of prefill rank; give its Serve to
// routerlink.ServeCommands, then Start it with the agent.
func NewPrefillEngine(rank uint32) *PrefillEngine {
	return &PrefillEngine{rank: rank, ready: make(chan struct{}), quit: make(chan struct{}),
		reqs: map[core.RequestKey]*prefillReq{}}
}

// Start hands the engine its agent; Serve waits for it.
func (e *PrefillEngine) Start(p *agent.Prefill) {
	e.p = p
	close(e.ready)
}

// Stop ends every request's production.
func (e *PrefillEngine) Stop() { e.once.Do(func() { close(e.quit) }) }

// Serve runs one router link's commands, in order, until the link ends.
func (e *PrefillEngine) Serve(l routerlink.Link) {
	<-e.ready
	serve(l, e.command)
}

func (e *PrefillEngine) command(c Command) Event {
	key := core.RequestKey{Room: c.Room, Gen: c.Gen}
	switch c.Op {
	case OpOpen:
		s := e.p.NewSender(key)
		if err := s.Init(c.Pages); err != nil {
			return errorEvent(err)
		}
		r := &prefillReq{s: s}
		e.mu.Lock()
		e.reqs[key] = r
		e.mu.Unlock()
		go e.produce(key, r, time.Duration(c.PageEvery))
		return Event{Kind: EventOK}
	case OpCancel:
		e.mu.Lock()
		r := e.reqs[key]
		e.mu.Unlock()
		if r != nil {
			r.mu.Lock()
			if !r.closed {
				r.closed = true
				r.s.Abort()
			}
			r.mu.Unlock()
		}
		return Event{Kind: EventOK}
	case OpStats:
		return statsEvent(e.p.Stats())
	}
	return unknownOp(c)
}

// produce is the simulated prefill compute of one request: one page every
// pageEvery, each filled with the oracle's content for this rank. A page is
// filled and sent under the request's lock, and only while the request is
// live: once the engine gave its pages back they may belong to another
// request, and writing them would be the engine's own use-after-free.
func (e *PrefillEngine) produce(key core.RequestKey, r *prefillReq, pageEvery time.Duration) {
	s := r.s
	defer func() {
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		if !closed { // wait for the request to end before giving it back
			select {
			case <-s.Done():
			case <-e.quit:
			}
		}
		r.mu.Lock()
		if !r.closed {
			r.closed = true
			s.Close()
		}
		r.mu.Unlock()
		e.mu.Lock()
		if e.reqs[key] == r {
			delete(e.reqs, key)
		}
		e.mu.Unlock()
	}()
	for i := 0; i < s.Pages(); i++ {
		if pageEvery > 0 {
			select {
			case <-time.After(pageEvery):
			case <-e.quit:
				return
			}
		}
		r.mu.Lock()
		live := !r.closed && s.Poll() != agent.PollFailed
		if live {
			oracle.FillShard(s.Page(i), oracle.PageIdentity{Room: key.Room, Gen: key.Gen, Page: uint32(i), Rank: e.rank})
			_ = s.Send(i + 1)
		}
		r.mu.Unlock()
		if !live {
			return
		}
	}
	r.mu.Lock()
	if !r.closed && s.Poll() != agent.PollFailed {
		_ = s.Finish(s.Pages())
	}
	r.mu.Unlock()
}
