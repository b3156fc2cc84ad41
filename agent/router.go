package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Router is the router's API over the control plane: it admits a request on
// decode, opens it on every prefill rank, and cancels prefill and decode of
// a request together.
type Router struct {
	decode   *routerLink
	prefills []*routerLink
	ranks    []uint32
	// Done receives decode's outcome of every admitted request.
	Done chan Event
}

type routerLink struct {
	l       *link
	nextID  atomic.Uint64
	mu      sync.Mutex
	pending map[uint64]chan Event
}

// DialRouter connects the router to a decode agent and its prefill ranks.
func DialRouter(ctx context.Context, decodeAddr string, prefillAddrs []string, tlsCfg *tls.Config) (*Router, error) {
	r := &Router{Done: make(chan Event, 1<<14)}
	hello := Hello{Role: RoleRouter, Version: ProtocolVersion}
	open := func(addr string) (*routerLink, error) {
		l, _, err := dial(ctx, addr, clientTLS(tlsCfg), hello)
		if err != nil {
			return nil, fmt.Errorf("router: link to %s: %w", addr, err)
		}
		rl := &routerLink{l: l, pending: map[uint64]chan Event{}}
		go rl.read(r.Done)
		return rl, nil
	}
	var err error
	if r.decode, err = open(decodeAddr); err != nil {
		return nil, err
	}
	for _, a := range prefillAddrs {
		pl, err := open(a)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.prefills = append(r.prefills, pl)
		r.ranks = append(r.ranks, pl.l.peer.Rank)
	}
	return r, nil
}

func (rl *routerLink) read(done chan<- Event) {
	for {
		f, err := rl.l.recv(nil)
		if err != nil {
			rl.mu.Lock()
			for id, ch := range rl.pending {
				ch <- Event{Kind: "error", Error: "link closed: " + err.Error(), Class: "unavailable"}
				delete(rl.pending, id)
			}
			rl.mu.Unlock()
			return
		}
		if f.Type != FrameEvent || f.Event == nil {
			continue
		}
		ev := *f.Event
		if ev.ID == 0 {
			done <- ev
			continue
		}
		rl.mu.Lock()
		ch := rl.pending[ev.ID]
		delete(rl.pending, ev.ID)
		rl.mu.Unlock()
		if ch != nil {
			ch <- ev
		}
	}
}

func (rl *routerLink) do(ctx context.Context, c Command) Event {
	c.ID = rl.nextID.Add(1)
	ch := make(chan Event, 1)
	rl.mu.Lock()
	rl.pending[c.ID] = ch
	rl.mu.Unlock()
	if !rl.l.send(&Frame{Type: FrameCommand, Command: &c}) {
		return Event{Kind: "error", Error: "link down", Class: "unavailable"}
	}
	select {
	case ev := <-ch:
		return ev
	case <-ctx.Done():
		return Event{Kind: "error", Error: ctx.Err().Error(), Class: "unavailable"}
	case <-time.After(30 * time.Second):
		return Event{Kind: "error", Error: "no reply from " + string(rl.l.peer.Role) + " in 30s", Class: "unavailable"}
	}
}

// Admit exposes slots on decode for a request written by every prefill rank.
func (r *Router) Admit(ctx context.Context, room, gen uint64, pages int, decodeFor time.Duration) Event {
	return r.decode.do(ctx, Command{Op: "admit", Room: room, Gen: gen, Pages: pages, Ranks: r.ranks, DecodeFor: int64(decodeFor)})
}

// Open starts the request on every prefill rank.
func (r *Router) Open(ctx context.Context, room, gen uint64, pages int, pageEvery time.Duration) error {
	for _, p := range r.prefills {
		if ev := p.do(ctx, Command{Op: "open", Room: room, Gen: gen, Pages: pages, PageEvery: int64(pageEvery)}); ev.Kind == "error" {
			return fmt.Errorf("open on prefill rank %d: %s", p.l.peer.Rank, ev.Error)
		}
	}
	return nil
}

// Cancel cancels prefill and decode of a request together. Nothing is
// recalled by it: posted writes stay governed by the core's lifetime rules.
func (r *Router) Cancel(ctx context.Context, room, gen uint64) {
	var wg sync.WaitGroup
	for _, rl := range append([]*routerLink{r.decode}, r.prefills...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rl.do(ctx, Command{Op: "cancel", Room: room, Gen: gen})
		}()
	}
	wg.Wait()
}

// DecodeStats fetches decode's figures.
func (r *Router) DecodeStats(ctx context.Context) (DecodeStats, error) {
	var s DecodeStats
	ev := r.decode.do(ctx, Command{Op: "stats"})
	if ev.Kind != "stats" {
		return s, fmt.Errorf("decode stats: %s", ev.Error)
	}
	return s, json.Unmarshal(ev.Stats, &s)
}

// PrefillStats fetches each prefill rank's raw figures (JSON).
func (r *Router) PrefillStats(ctx context.Context) []json.RawMessage {
	var out []json.RawMessage
	for _, p := range r.prefills {
		ev := p.do(ctx, Command{Op: "stats"})
		out = append(out, ev.Stats)
	}
	return out
}

// Close drops the router's links.
func (r *Router) Close() {
	if r.decode != nil {
		r.decode.l.close()
	}
	for _, p := range r.prefills {
		p.l.close()
	}
}
