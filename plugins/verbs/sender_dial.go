package verbs

// This file: a sender's queue pair comes and goes: the dial and handshake
// that connect it, and its destruction once every completion is harvested.

import (
	"math/rand/v2"
	"net"

	"github.com/kvfence/kvfence/errdefs"
)

// dialLocked creates a QP and connects it to a fresh responder QP at the
// peer. It holds t.mu for one TCP round trip (bounded by handshakeTimeout).
func (t *Transport) dialLocked(p *peer) (*conn, error) {
	nc, err := net.DialTimeout("tcp", p.addr, handshakeTimeout)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "verbs: dial %s: %v", p.addr, err)
	}
	q, err := t.d.newQP(t.cfg.QueueDepth + 1)
	if err != nil {
		nc.Close()
		return nil, err
	}
	fail := func(err error) (*conn, error) {
		_ = q.destroy()
		nc.Close()
		return nil, err
	}
	psn := rand.Uint32() & 0xffffff
	h, err := exchangeHellos(nc, p.addr, hello{qpAttrs: qpAttrs{QPN: q.num(), PSN: psn, GID: t.inf.GID}, From: t.ln.Addr().String()})
	if err != nil {
		return fail(err)
	}
	if err := q.connect(h.qpAttrs, psn, t.cfg.Timeout, t.cfg.RetryCnt); err != nil {
		return fail(err)
	}
	c := &conn{qp: q, ctrl: nc, ep: newEpoch()}
	t.byQPN[q.num()] = c
	t.stats["qp_connects"]++
	return c, nil
}

// destroyLocked destroys a QP whose completions are all harvested (or
// abandoned) and closes its control connection, which makes the peer
// destroy its responder QP.
func (t *Transport) destroyLocked(c *conn) {
	if c.destroyed {
		return
	}
	c.destroyed = true
	delete(t.byQPN, c.qp.num())
	for b, o := range t.owner {
		if o == c {
			delete(t.owner, b)
		}
	}
	_ = c.qp.destroy()
	_ = c.ctrl.Close()
}
