package agent

import (
	"fmt"
	"time"

	"github.com/kvfence/kvfence/core"
)

// KVSender is prefill's handle on one request (SGLang's BaseKVSender):
// Init reserves source pages, Page gives the memory to fill, Send marks a
// chunk computed, Finish ends production, Poll reports, Abort cancels.
// Dropping it never drops a hold: source pages come back only when no
// posted write can still read them.
type KVSender struct {
	p         *Prefill
	key       core.RequestKey
	pages     int
	src       []int
	autoClose bool
}

// NewSender makes a handle for the request key.
func (p *Prefill) NewSender(key core.RequestKey) *KVSender {
	return &KVSender{p: p, key: key, autoClose: true}
}

// Init reserves source pages and opens the request in the core.
func (s *KVSender) Init(pages int) error {
	var err error
	if !s.p.lp.call(func() {
		if len(s.p.free) < pages {
			err = fmt.Errorf("%w: %d source pages wanted, %d free", core.ErrResourceExhausted, pages, len(s.p.free))
			return
		}
		if err = s.p.core.Open(s.key, pages, now()); err != nil {
			return
		}
		n := len(s.p.free) - pages
		s.src = append([]int(nil), s.p.free[n:]...)
		s.p.free = s.p.free[:n]
		s.pages = pages
		s.p.reqs[s.key] = &preReq{key: s.key, src: s.src, state: PollBootstrapping, snd: s}
		s.p.act()
	}) {
		return errClosed
	}
	return err
}

// Page is the source memory of page i (one shard): the engine writes the
// page's KV here before Send covers it.
func (s *KVSender) Page(i int) []byte {
	b := s.p.src.Bytes()
	off := int64(s.src[i]) * s.p.cfg.ShardBytes
	return b[off : off+s.p.cfg.ShardBytes]
}

// Send marks pages [0, upto) as computed and sendable.
func (s *KVSender) Send(upto int) error {
	var err error
	s.p.lp.call(func() {
		if r := s.p.reqs[s.key]; r != nil && r.state == PollBootstrapping {
			r.state = PollTransferring
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

// Poll reports the request's state.
func (s *KVSender) Poll() PollState {
	st := PollSuccess
	s.p.lp.call(func() {
		if r := s.p.reqs[s.key]; r != nil {
			st = r.state
		}
	})
	return st
}

// Abort cancels the request here: unsent pages are dropped, in-flight work
// drains, and the request is closed.
func (s *KVSender) Abort() {
	s.p.lp.call(func() {
		if s.p.core.Abort(s.key, now()) == nil {
			s.p.act()
		}
		if r := s.p.reqs[s.key]; r != nil && !r.closed {
			r.closed = true
			if s.p.core.Close(s.key, now()) == nil {
				s.p.act()
			}
		}
	})
}

// produce is the demo's simulated prefill compute: one page every
// pageEvery, each filled with the oracle's content for this rank.
func (s *KVSender) produce(pageEvery time.Duration, quit <-chan struct{}) {
	for i := 0; i < s.pages; i++ {
		if pageEvery > 0 {
			select {
			case <-time.After(pageEvery):
			case <-quit:
				return
			}
		}
		// Fill and mark the page in one loop step, and only while the
		// request is live: once it ended, its source pages may already
		// belong to another request, and writing them would be the
		// engine's own use-after-free.
		live := false
		s.p.lp.call(func() {
			r := s.p.reqs[s.key]
			if r == nil || r.closed || r.state == PollFailed || r.snd != s {
				return
			}
			live = true
			FillShard(s.Page(i), PageIdentity{Room: s.key.Room, Gen: s.key.Gen, Page: uint32(i), Rank: uint32(s.p.cfg.Rank)})
			if r.state == PollBootstrapping {
				r.state = PollTransferring
			}
			if s.p.core.Produce(s.key, i+1, now()) == nil {
				s.p.act()
			}
		})
		if !live {
			return
		}
	}
	s.p.lp.call(func() {
		if r := s.p.reqs[s.key]; r != nil && !r.closed && r.state != PollFailed && s.p.core.Finish(s.key, s.pages, now()) == nil {
			s.p.act()
		}
	})
}

func (p *Prefill) accept(h Hello) (Hello, error) {
	if h.Role != RoleRouter {
		return Hello{}, fmt.Errorf("prefill rank %d accepts routers only, not %q", p.cfg.Rank, h.Role)
	}
	if h.Version != ProtocolVersion {
		return Hello{}, fmt.Errorf("incompatible router: speaks control protocol v%d, prefill speaks v%d", h.Version, ProtocolVersion)
	}
	return p.hello, nil
}

// serveRouter runs router commands: open (the simulated engine computes
// and sends the request), cancel, stats.
func (p *Prefill) serveRouter(l *link) {
	for {
		f, err := l.recv(nil)
		if err != nil {
			return
		}
		if f.Type != FrameCommand || f.Command == nil {
			continue
		}
		c := *f.Command
		reply := func(ev Event) {
			ev.ID, ev.Room, ev.Gen = c.ID, c.Room, c.Gen
			l.send(&Frame{Type: FrameEvent, Event: &ev})
		}
		key := core.RequestKey{Room: c.Room, Gen: c.Gen}
		switch c.Op {
		case "open":
			s := p.NewSender(key)
			if err := s.Init(c.Pages); err != nil {
				reply(Event{Kind: "error", Error: err.Error(), Class: classOf(err)})
				continue
			}
			reply(Event{Kind: "ok"})
			go s.produce(time.Duration(c.PageEvery), p.quit)
		case "cancel":
			p.lp.call(func() {
				if p.core.Abort(key, now()) == nil {
					p.act()
				}
				if r := p.reqs[key]; r != nil && !r.closed {
					r.closed = true
					if p.core.Close(key, now()) == nil {
						p.act()
					}
				}
			})
			reply(Event{Kind: "ok"})
		case "stats":
			m := p.Stats()
			b := mustJSON(m)
			reply(Event{Kind: "stats", Stats: b})
		default:
			reply(Event{Kind: "error", Error: "unknown op " + c.Op})
		}
	}
}
