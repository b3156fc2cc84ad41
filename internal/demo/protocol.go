package demo

import (
	"encoding/json"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/routerlink"
)

// Op is what a router asks of an agent.
type Op string

const (
	OpAdmit  Op = "admit"  // decode: expose slots for a request written by Ranks
	OpOpen   Op = "open"   // prefill: compute and send a request (the simulated engine)
	OpCancel Op = "cancel" // either: abort a request (nothing is recalled by it)
	OpStats  Op = "stats"  // either: the agent's figures
)

// EventKind is what an agent's event says.
type EventKind string

const (
	EventOK    EventKind = "ok"    // the command succeeded
	EventError EventKind = "error" // the command failed: Class and Error say why
	EventDone  EventKind = "done"  // unsolicited: how an admitted request ended on decode
	EventStats EventKind = "stats" // the answer to OpStats
)

// Command is a router instruction to an agent. ID pairs it with its reply.
type Command struct {
	ID    uint64   `json:"id"`
	Op    Op       `json:"op"`
	Room  uint64   `json:"room,omitempty"`
	Gen   uint64   `json:"gen,omitempty"`
	Pages int      `json:"pages,omitempty"`
	Ranks []uint32 `json:"ranks,omitempty"`
	// DecodeFor is how long the simulated decode loop keeps a handed-off
	// request before finishing it; nanoseconds.
	DecodeFor int64 `json:"decode_for,omitempty"`
	// PageEvery paces the simulated prefill compute; nanoseconds per page.
	PageEvery int64 `json:"page_every,omitempty"`
}

// Event is an agent's reply or report to the router.
type Event struct {
	ID    uint64          `json:"id,omitempty"` // the command it answers; 0 for unsolicited
	Kind  EventKind       `json:"kind"`
	Room  uint64          `json:"room,omitempty"`
	Gen   uint64          `json:"gen,omitempty"`
	Error string          `json:"error,omitempty"`
	Class errdefs.Class   `json:"class,omitempty"`
	Done  *RequestOutcome `json:"done,omitempty"`
	Stats json.RawMessage `json:"stats,omitempty"`
}

// Err is the event's error, classified (nil unless Kind is EventError).
func (ev Event) Err() error {
	if ev.Kind != EventError {
		return nil
	}
	return errdefs.Errorf(ev.Class, "%s", ev.Error)
}

// errorEvent reports err with its class.
func errorEvent(err error) Event {
	return Event{Kind: EventError, Error: err.Error(), Class: errdefs.ClassOf(err)}
}

// RequestOutcome is how a request ended on decode, as the router sees it.
type RequestOutcome struct {
	Handed bool   `json:"handed"`
	Reason string `json:"reason,omitempty"`
}

// serve runs a link's commands in order through handle, answering each,
// until the link ends.
func serve(l routerlink.Link, handle func(Command) Event) {
	for {
		raw, err := l.Recv()
		if err != nil {
			return
		}
		var c Command
		if err := json.Unmarshal(raw, &c); err != nil {
			_ = l.Send(errorEvent(errdefs.Errorf(errdefs.InvalidArgument, "command: %v", err)))
			continue
		}
		ev := handle(c)
		ev.ID, ev.Room, ev.Gen = c.ID, c.Room, c.Gen
		_ = l.Send(ev)
	}
}

// statsEvent answers OpStats with v.
func statsEvent(v any) Event {
	b, err := json.Marshal(v)
	if err != nil {
		return errorEvent(errdefs.Errorf(errdefs.Internal, "stats: %v", err))
	}
	return Event{Kind: EventStats, Stats: b}
}

// unknownOp refuses a command no engine takes.
func unknownOp(c Command) Event {
	return errorEvent(errdefs.Errorf(errdefs.InvalidArgument, "unknown op %q", c.Op))
}
