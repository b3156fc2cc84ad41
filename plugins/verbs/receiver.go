package verbs

// This file: the receiving side's handshake listener and responder QPs,
// one per connected sender, destroyed when its control connection closes.

import (
	"bufio"
	"context"
	"io"
	"math/rand/v2"
	"net"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// responder is the receiving side of one writer's connection.
type responder struct {
	q     *qp
	from  string            // the writer's LocalEndpoint address
	bound map[*binding]bool // type-2 windows bound through q (under amu)
}

// binding is a type-2 window bound on a responder QP. live says whether it
// is still bound: invalidating one that is not is an error (and a kernel
// NULL dereference on rxe 6.1), so it is tracked here, under amu.
type binding struct {
	rkey uint32
	live bool
	on   *responder
}

func (t *Transport) LocalEndpoint(ctx context.Context) (sdk.Endpoint, error) {
	return sdk.Endpoint{Transport: "verbs", Address: t.ln.Addr().String(), Opaque: t.inf.GID[:]}, nil
}

func (t *Transport) acceptLoop() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		go t.serveHandshake(c)
	}
}

// serveHandshake creates the responder QP for one sender and destroys it
// when the sender's control connection closes.
func (t *Transport) serveHandshake(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	h, err := readHello(br, c)
	if err != nil {
		return
	}
	q, err := t.d.newResponderQP(16)
	if err == nil {
		psn := rand.Uint32() & 0xffffff
		if err = q.connect(h.qpAttrs, psn, t.cfg.Timeout, t.cfg.RetryCnt); err == nil {
			t.amu.Lock()
			if t.aclosed {
				err = errdefs.Errorf(errdefs.Unavailable, "verbs: closed")
			} else {
				t.accepts[c] = &responder{q: q, from: h.From, bound: map[*binding]bool{}}
			}
			t.amu.Unlock()
			if err == nil {
				err = writeHello(c, hello{qpAttrs: qpAttrs{QPN: q.num(), PSN: psn, GID: t.inf.GID}})
			}
		}
	}
	if err != nil {
		_ = writeHello(c, refusal(err))
		if q != nil {
			_ = q.destroy()
		}
		return
	}
	_, _ = io.Copy(io.Discard, br) // until the sender closes (or Close)
	t.amu.Lock()
	if r, ok := t.accepts[c]; ok {
		delete(t.accepts, c)
		t.retireResponderLocked(r)
	}
	t.amu.Unlock()
}

// retireResponderLocked invalidates the type-2 windows bound through r (a
// key lives no longer than its writer's connection) and destroys r's QP.
// If a window cannot be invalidated the QP is left in ERROR, not destroyed:
// a bound window holds the QP, and the device must never be left with a
// window pointing at a freed QP. Caller holds amu.
func (t *Transport) retireResponderLocked(r *responder) {
	ok := true
	for b := range r.bound {
		if err := t.invalidateLocked(b); err != nil {
			t.log.Error("type-2 window not invalidated; responder QP kept in ERROR", "error", err)
			ok = false
		}
	}
	if !ok {
		_ = r.q.toError()
		return
	}
	_ = r.q.destroy()
}

// invalidateLocked unbinds a live type-2 window (LOCAL_INV). Caller holds amu.
func (t *Transport) invalidateLocked(b *binding) error {
	if !b.live {
		return nil
	}
	if err := t.d.invalidateMW2(b.rkey); err != nil {
		return err
	}
	b.live = false
	delete(b.on.bound, b)
	return nil
}
