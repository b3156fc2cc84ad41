package agent

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/kvfence/kvfence/core"
)

var errClosed = errors.New("agent closed")

func classOf(err error) string {
	switch {
	case errors.Is(err, core.ErrResourceExhausted):
		return "resource-exhausted"
	case errors.Is(err, core.ErrAlreadyExists):
		return "already-exists"
	case errors.Is(err, core.ErrNotFound):
		return "not-found"
	case errors.Is(err, core.ErrInvalidArgument):
		return "invalid-argument"
	}
	return "failed-precondition"
}

// command runs a router instruction on decode (loop only). The simulated
// engine behind it is the demo's decode loop: a handed-off request is kept
// for DecodeFor, verified again, and finished.
func (d *Decode) command(l *link, c Command) {
	reply := func(ev Event) {
		ev.ID, ev.Room, ev.Gen = c.ID, c.Room, c.Gen
		l.send(&Frame{Type: FrameEvent, Event: &ev})
	}
	key := core.RequestKey{Room: c.Room, Gen: c.Gen}
	switch c.Op {
	case "admit":
		rv := d.NewReceiver(key)
		rv.decodeFor = time.Duration(c.DecodeFor)
		rv.onDone = func(o RequestOutcome) {
			l.send(&Frame{Type: FrameEvent, Event: &Event{Kind: "done", Room: c.Room, Gen: c.Gen, Done: &o}})
		}
		ranks := make([]core.RankID, len(c.Ranks))
		for i, r := range c.Ranks {
			ranks[i] = core.RankID(r)
		}
		tag, err := d.admit(key, c.Pages, ranks, rv)
		rv.tag = tag
		if err != nil {
			reply(Event{Kind: "error", Error: err.Error(), Class: classOf(err)})
			return
		}
		reply(Event{Kind: "ok"})
	case "cancel":
		if dt := d.tags[key]; dt != nil && dt.state != PollSuccess && dt.state != PollFailed {
			_ = d.core.Abort(dt.tag, core.ReasonClientAbort, now())
			d.act()
		}
		reply(Event{Kind: "ok"})
	case "stats":
		s := d.stats.clone()
		s.Core = d.core.Metrics()
		s.LiveTags = len(d.tags)
		for _, pl := range d.links {
			s.ReplaysRefused += pl.replays.Load()
		}
		b, _ := json.Marshal(s)
		reply(Event{Kind: "stats", Stats: b})
	default:
		reply(Event{Kind: "error", Error: "unknown op " + c.Op, Class: "invalid-argument"})
	}
}
