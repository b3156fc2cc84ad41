package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/routerlink"
)

// commandLink is a routerlink.Link: a control-plane link between a router
// and an agent that carries the router protocol, commands one way, events
// the other, as JSON payloads the runtime does not read. The agent side is
// handed to the handler routerlink.ServeCommands put in a DecodeConfig or
// PrefillConfig; the router side comes from routerlink.Dial (dialCommands). Links keep the control
// plane's rules: Hello first, mutual TLS identity, sequence numbers that
// refuse replays. None of it is public API: the router protocol is the
// demo's (internal/routerlink says why).
type commandLink struct {
	l   *link
	in  frameType // what Recv takes
	out frameType // what Send sends
}

func init() {
	routerlink.SetDialer(func(ctx context.Context, addr string, tlsCfg *tls.Config, role string, rank uint32) (routerlink.Link, error) {
		c, err := dialCommands(ctx, addr, tlsCfg, Role(role), rank)
		if err != nil {
			return nil, err // not a nil *commandLink in a non-nil interface
		}
		return c, nil
	})
	routerlink.SetCommandsHook(setCommands)
}

// setCommands sets cfg's router-link handler (routerlink.ServeCommands).
func setCommands(cfg any, serve func(routerlink.Link)) error {
	switch c := cfg.(type) {
	case *DecodeConfig:
		c.commands = serve
	case *PrefillConfig:
		c.commands = serve
	default:
		return errdefs.Errorf(errdefs.InvalidArgument, "router commands: %T is no *agent.DecodeConfig or *agent.PrefillConfig", cfg)
	}
	return nil
}

// agentLink is the agent's side of a router's link.
func agentLink(l *link) routerlink.Link { return &commandLink{l: l, in: frameCommand, out: frameEvent} }

// dialCommands opens a router's link to the agent at addr, which must be
// the agent of role and rank: a peer whose certificate (with TLS) or
// Welcome names anyone else is refused, FailedPrecondition.
func dialCommands(ctx context.Context, addr string, tlsCfg *tls.Config, role Role, rank uint32) (*commandLink, error) {
	l, _, err := dial(ctx, addr, tlsCfg, identity{role, rank}, peerHello{Role: RoleRouter, Version: ControlVersion})
	if err != nil {
		return nil, err
	}
	go keepAlive(l, routerKeepalive) // within the agent's RouterIdleTimeout (admission.go)
	return &commandLink{l: l, in: frameEvent, out: frameCommand}, nil
}

// Send queues one payload (JSON-encoded). Unavailable when the link is
// down or its queue full: the payload was dropped.
func (c *commandLink) Send(payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return errdefs.Errorf(errdefs.InvalidArgument, "command link: %v", err)
	}
	if !c.l.send(&frame{Type: c.out, Payload: b}) {
		return errdefs.Errorf(errdefs.Unavailable, "command link to %s: dropped (link down or full)", c.l.peer.Role)
	}
	return nil
}

// Recv returns the next payload; an error means the link is gone. On an
// agent, commands are read within the router certificate's rate
// (admission.go); a router's keepalive (no payload) is skipped.
func (c *commandLink) Recv() (json.RawMessage, error) {
	for {
		f, err := c.l.recv(nil)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.Unavailable, "command link to %s: %v", c.l.peer.Role, err)
		}
		if f.Type != c.in || f.Payload == nil {
			continue
		}
		if c.l.cmdRate != nil {
			if err := c.l.cmdRate.Wait(c.l.s.Context()); err != nil {
				return nil, errdefs.Errorf(errdefs.Unavailable, "command link to %s: %v", c.l.peer.Role, err)
			}
		}
		return f.Payload, nil
	}
}

// PeerRank is the rank the far end named in its Hello (router side: the
// agent's rank).
func (c *commandLink) PeerRank() uint32 { return c.l.peer.Rank }

// Close drops the link.
func (c *commandLink) Close() { c.l.close() }
