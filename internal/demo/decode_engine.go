package demo

import (
	"sync"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/routerlink"
)

// DecodeEngine is the simulated engine behind a decode agent: it admits
// what the router asks, keeps a handed-off request for the command's
// DecodeFor (its decode loop), then finishes it, and reports how every
// request ended. It uses the runtime's public API only.
type DecodeEngine struct {
	ready chan struct{}
	d     *agent.Decode
	mu    sync.Mutex
	reqs  map[core.RequestKey]*agent.KVReceiver
}

// NewDecodeEngine makes an engine; give its Serve to routerlink.ServeCommands,
// then Start it with the agent.
func NewDecodeEngine() *DecodeEngine {
	return &DecodeEngine{ready: make(chan struct{}), reqs: map[core.RequestKey]*agent.KVReceiver{}}
}

// Start hands the engine its agent; Serve waits for it.
func (e *DecodeEngine) Start(d *agent.Decode) {
	e.d = d
	close(e.ready)
}

// Serve runs one router link's commands, in order, until the link ends.
func (e *DecodeEngine) Serve(l routerlink.Link) {
	<-e.ready
	serve(l, func(c Command) Event { return e.command(l, c) })
}

func (e *DecodeEngine) command(l routerlink.Link, c Command) Event {
	key := core.RequestKey{Room: c.Room, Gen: c.Gen}
	switch c.Op {
	case OpAdmit:
		ranks := make([]core.RankID, len(c.Ranks))
		for i, r := range c.Ranks {
			ranks[i] = core.RankID(r)
		}
		rv := e.d.NewReceiver(key)
		if _, err := rv.Init(c.Pages, ranks); err != nil {
			return errorEvent(err)
		}
		e.mu.Lock()
		e.reqs[key] = rv
		e.mu.Unlock()
		go e.follow(l, rv, key, time.Duration(c.DecodeFor))
		return Event{Kind: EventOK}
	case OpCancel:
		e.mu.Lock()
		rv := e.reqs[key]
		e.mu.Unlock()
		if rv != nil {
			rv.Abort()
		}
		return Event{Kind: EventOK}
	case OpStats:
		return statsEvent(e.d.Stats())
	}
	return unknownOp(c)
}

// follow is the decode loop of one request: a handed-off request is kept
// for decodeFor, then finished (the runtime verifies its pages again); the
// router hears how it ended.
func (e *DecodeEngine) follow(l routerlink.Link, rv *agent.KVReceiver, key core.RequestKey, decodeFor time.Duration) {
	<-rv.Done()
	out := RequestOutcome{Handed: rv.Poll() == agent.PollSuccess}
	if out.Handed {
		time.Sleep(decodeFor)
		rv.Finish()
	} else if err := rv.Err(); err != nil {
		out.Reason = err.Error()
	}
	e.mu.Lock()
	if e.reqs[key] == rv {
		delete(e.reqs, key)
	}
	e.mu.Unlock()
	_ = l.Send(Event{Kind: EventDone, Room: key.Room, Gen: key.Gen, Done: &out})
}
