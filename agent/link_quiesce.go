package agent

import (
	"slices"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// Closing an idle prefill→decode link is a handshake, not a local decision.
// Decode sends a request's Assign over the link it has, so a prefill agent
// that looks idle may be about to receive the next request's Assign (decided
// by decode, already on the wire). Closed on its own, that Assign is lost
// and the request fails when decode's lease lapses. So:
//
//  1. prefill (QuiesceLink) sends frameQuiesce on its link;
//  2. decode, in its loop, marks the link quiescing — from then on it
//     exposes no request to that rank (Linked is false, admit refuses
//     Unavailable) — and answers frameQuiesceOK on the same link once no
//     exposure's keys are still being granted for that rank: such an
//     exposure's Assign is held until its keys exist (async_grant.go), and
//     an answer sent before it would let prefill agree and close while
//     the Assign was still to come (lost: the request failed lease-lapsed
//     after the lease, seen in CI);
//  3. the link is ordered: every Assign decode sent before it reached
//     prefill's loop before the answer. Prefill agrees only if its core then
//     holds no stream; otherwise it sends frameResume and stays open.
//
// After an agreement the caller either closes the agent or calls ResumeLink.
// Decode keeps refusing the rank until frameResume or a new link from it
// (which the agreed agent never dials), so a request decode picked the link
// for between its check and the close waits for the next link instead of
// being lost. A decode that does not know the frames never answers: the
// link is then never closed for idleness (safe, not lean).

// QuiesceLink asks decode whether this agent may close. true: decode agreed
// and no Assign is held here, nor can one come (decode refuses to expose
// requests to this rank, and the agent dials no new link, until ResumeLink);
// the caller must Close the agent or ResumeLink. false: a stream is held,
// decode did not answer within timeout, or the link is down with a dial in
// flight; decode was told to carry on, nothing to undo.
func (p *Prefill) QuiesceLink(timeout time.Duration) bool {
	ch := make(chan bool, 1)
	if !p.lp.call(func() { p.startQuiesce(ch) }) {
		return false
	}
	select {
	case ok := <-ch:
		return ok
	case <-time.After(timeout):
	}
	p.lp.call(func() {
		if p.quiesceWait == ch {
			p.quiesceWait = nil
			p.resumeLinkInLoop() // decode may still answer: it is told to carry on
		}
	})
	select {
	case ok := <-ch: // answered between the timeout and the loop's turn
		return ok
	default:
		return false
	}
}

// startQuiesce (loop only). Without a link and no dial in flight nothing can
// be assigned here, and the agent dials no more until ResumeLink, so
// agreeing is safe. A dial in flight may give decode a link it would assign
// over: busy (the next sweep asks again).
func (p *Prefill) startQuiesce(ch chan bool) {
	if p.quiesceWait != nil || p.closeAgreed || (p.link == nil && p.dialing) {
		ch <- false
		return
	}
	if p.link == nil {
		p.closeAgreed = true
		ch <- true
		return
	}
	if !p.link.send(&frame{Type: frameQuiesce}) {
		ch <- false
		return
	}
	p.quiesceWait = ch
}

// onQuiesceOK is decode's answer (loop only): all its Assigns on this link
// were stepped before it.
func (p *Prefill) onQuiesceOK(l *link) {
	ch := p.quiesceWait
	if ch == nil || l != p.link {
		if l == p.link && !p.closeAgreed {
			p.resumeLinkInLoop() // an answer we stopped waiting for
		}
		return
	}
	p.quiesceWait = nil
	if p.core.Metrics().Streams > 0 {
		p.resumeLinkInLoop()
		ch <- false
		return
	}
	p.closeAgreed = true
	ch <- true
}

// startDial and endDial bracket connectLoop's dials (loop only): none starts
// once the agent agreed to close.
func (p *Prefill) startDial() bool {
	p.dialing = !p.closeAgreed
	return p.dialing
}

func (p *Prefill) endDial() { p.dialing = false }

// ResumeLink undoes an agreed QuiesceLink: decode may expose requests to
// this rank again.
func (p *Prefill) ResumeLink() {
	p.lp.call(p.resumeLinkInLoop)
}

func (p *Prefill) resumeLinkInLoop() {
	p.closeAgreed = false
	if p.link != nil {
		p.link.send(&frame{Type: frameResume})
	}
}

// onQuiesce is a prefill rank's request to close its link (loop only).
func (d *Decode) onQuiesce(l *link) {
	if d.links[core.RankID(l.peer.Rank)] != l {
		return // an old link: its rank has a newer one
	}
	l.quiescing = true
	d.publishLinked()
	if !l.quiesceOKDue {
		l.quiesceOKDue = true
		d.quiesceOwed++
	}
	d.answerQuiesces()
}

func (d *Decode) onResume(l *link) {
	if d.links[core.RankID(l.peer.Rank)] == l {
		l.quiescing = false
		d.settleQuiesce(l)
		d.publishLinked()
	}
}

// answerQuiesces sends each owed frameQuiesceOK whose rank has no Assign
// held behind a grant in flight (loop only): the answer then follows every
// Assign decode will ever send that rank over this link. Run at a
// handshake and whenever a grant ends.
func (d *Decode) answerQuiesces() {
	if d.quiesceOwed == 0 {
		return // the common case: a grant's end costs nothing more
	}
	for rank, l := range d.links {
		if l.quiesceOKDue && (d.cfg.unsafeQuiesceEarly || !d.assignPending(rank)) {
			d.settleQuiesce(l)
			l.send(&frame{Type: frameQuiesceOK})
		}
	}
}

// settleQuiesce clears what decode owes l (loop only): answered, resumed,
// or the link is gone.
func (d *Decode) settleQuiesce(l *link) {
	if l.quiesceOKDue {
		l.quiesceOKDue = false
		d.quiesceOwed--
	}
}

// assignPending reports whether an exposure of rank's is still being
// granted its keys, its Assign held until then (loop only).
func (d *Decode) assignPending(rank core.RankID) bool {
	for _, dt := range d.tags {
		if dt.granting && slices.Contains(dt.ranks, rank) {
			return true
		}
	}
	return false
}

// checkQuiesced refuses an exposure to a rank that agreed to close its link
// (loop only): its Assign would be lost. Unavailable: the caller waits for
// the rank to link again.
func (d *Decode) checkQuiesced(key core.RequestKey, ranks []core.RankID) error {
	for _, r := range ranks {
		if l := d.links[r]; (l != nil && l.quiescing) || (l == nil && d.quiesced[r]) {
			return errdefs.Errorf(errdefs.Unavailable, "request %d/%d: prefill rank %d is closing its link; "+
				"expose the request once it links again", key.Room, key.Gen, r)
		}
	}
	return nil
}

// quiesceFrame handles the handshake's frames on either side; false when f
// is not one of them.
func quiesceFrame(f *frame, l *link, lp *loop, fn func(frameType)) (handled, ok bool) {
	switch f.Type {
	case frameQuiesce, frameQuiesceOK, frameResume:
		t := f.Type
		return true, l.toLoop(lp, func() { fn(t) })
	}
	return false, true
}
