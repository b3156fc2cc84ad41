package routerlink

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
)

// Link is a control-plane link between a router and an agent that carries
// the router protocol: commands one way, events the other, as JSON
// payloads the runtime does not read.
type Link interface {
	// Send queues one payload (JSON-encoded). Unavailable when the link
	// is down or its queue full: the payload was dropped.
	Send(payload any) error
	// Recv returns the next payload; an error means the link is gone.
	Recv() (json.RawMessage, error)
	// PeerRank is the rank the far end named in its Hello (router side:
	// the agent's rank).
	PeerRank() uint32
	// Close drops the link.
	Close()
}

// Dialer opens a router's link to the agent at addr, which must be the
// agent of role ("decode" or "prefill") and rank.
type Dialer func(ctx context.Context, addr string, tlsCfg *tls.Config, role string, rank uint32) (Link, error)

var dialer Dialer

// SetDialer is called once, by package agent's init.
func SetDialer(d Dialer) { dialer = d }

// Dial opens a router's link to the agent at addr: a peer whose
// certificate (with TLS) or Welcome names anyone other than role and rank
// is refused, FailedPrecondition.
func Dial(ctx context.Context, addr string, tlsCfg *tls.Config, role string, rank uint32) (Link, error) {
	if dialer == nil {
		return nil, errors.New("routerlink: no dialer (package agent is not linked in)")
	}
	return dialer(ctx, addr, tlsCfg, role, rank)
}
