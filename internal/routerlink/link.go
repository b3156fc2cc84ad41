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

// commandsHook sets an agent configuration's router-link handler; package
// agent fills it in at init, because the field it sets is unexported: the
// router protocol is not an engine's API, so no exported field may carry
// a type that code outside this module cannot name.
var commandsHook func(cfg any, serve func(Link)) error

// SetCommandsHook is called once, by package agent's init.
func SetCommandsHook(h func(cfg any, serve func(Link)) error) { commandsHook = h }

// ServeCommands makes the agent built from cfg (a *agent.DecodeConfig or
// *agent.PrefillConfig) serve each router link with serve until the link
// ends; without it the agent refuses routers. Any other cfg is an error.
func ServeCommands(cfg any, serve func(Link)) error {
	if commandsHook == nil {
		return errors.New("routerlink: no commands hook (package agent is not linked in)")
	}
	return commandsHook(cfg, serve)
}
