package demo

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/routerlink"
)

// DecodeRank is the demo's decode rank; its prefill ranks are 1..n.
const DecodeRank = 0

// Router is the demo's router: it admits a request on decode, opens it on
// every prefill rank, and cancels prefill and decode of a request together,
// over one router link per agent (internal/routerlink).
type Router struct {
	decode   *routerLink
	prefills []*routerLink
	ranks    []uint32
	// Done receives decode's outcome of every admitted request.
	Done chan Event
}

type routerLink struct {
	l       routerlink.Link
	nextID  atomic.Uint64
	mu      sync.Mutex
	pending map[uint64]chan Event
}

// DialRouter connects the router to the demo's decode agent (rank
// DecodeRank) and its prefill ranks: prefillAddrs[i] is prefill rank i+1.
// An agent that is not the one meant (by its certificate or Welcome) is
// refused.
func DialRouter(ctx context.Context, decodeAddr string, prefillAddrs []string, tlsCfg *tls.Config) (*Router, error) {
	r := &Router{Done: make(chan Event, 1<<14)}
	open := func(addr string, role agent.Role, rank uint32) (*routerLink, error) {
		l, err := routerlink.Dial(ctx, addr, tlsCfg, string(role), rank)
		if err != nil {
			return nil, fmt.Errorf("router: link to %s: %w", addr, err)
		}
		rl := &routerLink{l: l, pending: map[uint64]chan Event{}}
		go rl.read(r.Done)
		return rl, nil
	}
	var err error
	if r.decode, err = open(decodeAddr, agent.RoleDecode, DecodeRank); err != nil {
		return nil, err
	}
	for i, a := range prefillAddrs {
		pl, err := open(a, agent.RolePrefill, uint32(i+1))
		if err != nil {
			r.Close()
			return nil, err
		}
		r.prefills = append(r.prefills, pl)
		r.ranks = append(r.ranks, pl.l.PeerRank())
	}
	return r, nil
}

func (rl *routerLink) read(done chan<- Event) {
	for {
		raw, err := rl.l.Recv()
		if err != nil {
			rl.mu.Lock()
			for id, ch := range rl.pending {
				ch <- errorEvent(err)
				delete(rl.pending, id)
			}
			rl.mu.Unlock()
			return
		}
		var ev Event
		if json.Unmarshal(raw, &ev) != nil {
			continue
		}
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
	if err := rl.l.Send(c); err != nil {
		rl.mu.Lock()
		delete(rl.pending, c.ID)
		rl.mu.Unlock()
		return errorEvent(err)
	}
	select {
	case ev := <-ch:
		return ev
	case <-ctx.Done():
		return errorEvent(ctx.Err())
	case <-time.After(30 * time.Second):
		return errorEvent(errdefs.Errorf(errdefs.Unavailable, "no reply from rank %d in 30s", rl.l.PeerRank()))
	}
}

// Admit exposes slots on decode for a request written by every prefill
// rank. The error is classified: ResourceExhausted means decode is full
// (holds count) and a retry may succeed.
func (r *Router) Admit(ctx context.Context, room, gen uint64, pages int, decodeFor time.Duration) error {
	return r.decode.do(ctx, Command{Op: OpAdmit, Room: room, Gen: gen, Pages: pages, Ranks: r.ranks, DecodeFor: int64(decodeFor)}).Err()
}

// Open starts the request on every prefill rank.
func (r *Router) Open(ctx context.Context, room, gen uint64, pages int, pageEvery time.Duration) error {
	for _, p := range r.prefills {
		if err := p.do(ctx, Command{Op: OpOpen, Room: room, Gen: gen, Pages: pages, PageEvery: int64(pageEvery)}).Err(); err != nil {
			return fmt.Errorf("open on prefill rank %d: %w", p.l.PeerRank(), err)
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
			rl.do(ctx, Command{Op: OpCancel, Room: room, Gen: gen})
		}()
	}
	wg.Wait()
}

// DecodeStats fetches decode's figures.
func (r *Router) DecodeStats(ctx context.Context) (agent.DecodeStats, error) {
	var s agent.DecodeStats
	ev := r.decode.do(ctx, Command{Op: OpStats})
	if ev.Kind != EventStats {
		return s, fmt.Errorf("decode stats: %w", ev.Err())
	}
	return s, json.Unmarshal(ev.Stats, &s)
}

// PrefillStats fetches each prefill rank's raw figures (JSON).
func (r *Router) PrefillStats(ctx context.Context) []json.RawMessage {
	var out []json.RawMessage
	for _, p := range r.prefills {
		ev := p.do(ctx, Command{Op: OpStats})
		out = append(out, ev.Stats)
	}
	return out
}

// Close drops the router's links.
func (r *Router) Close() {
	if r.decode != nil {
		r.decode.l.Close()
	}
	for _, p := range r.prefills {
		p.l.Close()
	}
}
