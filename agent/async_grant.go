package agent

import (
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

// This file: an exposure's keys are granted off the loop and off the
// admission (issue 21 item 1). A grant is a round trip to the plugin
// process; made inside Init it held the engine's admission and every other
// input of the loop for it (about 2 ms per request under the demo, against
// 0.2 ms with no fence). Now Init returns once the core admitted the
// exposure, and:
//
//   - the exposure's control messages (its Assigns first) wait in its
//     decTag, in order, until its keys exist; messages of other
//     exposures go out meanwhile. A rank learns of the exposure only
//     from its Assign, which then carries the keys;
//   - a revocation the core asks while the grant is in flight waits for
//     it: the keys are granted, then revoked, and only a revocation the
//     plugin confirms is fed back as Revoked (a fenced exposure's slots
//     are reused only after that);
//   - keys that arrive for an exposure the core released meanwhile (a
//     timeout) go to nobody: they are revoked, and the held messages
//     dropped.
//
// DecodeConfig.unsafeGrantRace is the known-unsafe variant (tests only):
// the revocation does not wait for the grant, and the keys go out to an
// exposure already released.

// heldFrame is a control message held until its exposure's keys exist.
type heldFrame struct {
	to     core.RankID
	f      *frame
	assign bool
}

// grantAsync queues an exposure's grant (loop only): the grant queue
// makes the keys off the loop, in one call with the grants queued with it
// (grantBatch), and keysMade takes them back in the loop.
func (d *Decode) grantAsync(dt *decTag) {
	reqs, shared := d.planGrants(dt)
	dt.granting = true
	j := &grantJob{dt: dt, reqs: reqs, shared: shared, slots: dt.slots}
	if d.shardKeys == sdk.BoundsNone && !shared && boundReqs(reqs) {
		j.fallback = d.sharedReq(dt) // in case a writer is not connected yet
	}
	d.grantQ.add(j)
}

// boundReqs: some request asks keys bound to a writer.
func boundReqs(reqs []*grantReq) bool {
	for _, r := range reqs {
		if r.writer != "" {
			return true
		}
	}
	return false
}

// grantBatch grants a batch of exposures' keys in one call (and, for
// writers not connected yet, a second: grantUnbound) and hands them to the
// loop in one input.
func (d *Decode) grantBatch(jobs []*grantJob) {
	d.grantMany(jobs)
	if !d.cfg.syncUnboundGrants {
		d.grantUnbound(jobs)
	}
	d.lp.post(func() {
		for _, j := range jobs {
			d.keysMade(j)
		}
	})
}

// keysMade ends an exposure's grant (loop only): its held messages go out
// with their keys, then a revocation asked meanwhile runs.
func (d *Decode) keysMade(j *grantJob) {
	dt := j.dt
	dt.granting = false
	defer d.answerQuiesces() // after the held Assigns went out
	dt.granted = append(dt.granted, j.keys...)
	if d.tags[dt.tag.Key()] != dt && !d.cfg.unsafeGrantRace {
		// Released while its keys were made: no rank has them, and no
		// rank ever will.
		d.hygieneRevoke(dt.granted)
		dt.granted, dt.held = nil, nil
		return
	}
	err := d.finishGrants(dt, j)
	held := dt.held
	dt.held = nil
	for _, h := range held {
		if h.assign {
			h.f.Keys = dt.keysFor(d, h.to)
		}
		d.sendFrame(h.to, h.f)
	}
	if dt.revokeAsked {
		// The core is fencing it already: revoke what was just granted.
		dt.revokeAsked = false
		d.revokeAll([]core.Revoke{{Tag: dt.tag}})
		return
	}
	if err != nil {
		d.log.Error("grant failed: aborting the exposure", "tag", dt.tag, "error", err)
		_ = d.core.Abort(dt.tag, core.ReasonDecodeAbort, now())
		d.act()
	}
}

// holdFrame keeps a message of an exposure whose keys are being granted
// (loop only); false when the message may go out now.
func (d *Decode) holdFrame(to core.RankID, m *core.Message, f *frame) bool {
	dt := d.tags[m.Tag.Key()]
	if dt == nil || dt.tag != m.Tag || !dt.granting {
		return false
	}
	dt.held = append(dt.held, heldFrame{to: to, f: f, assign: m.Kind == core.KindAssign})
	return true
}

// awaitGrant notes a revocation asked while the exposure's keys are being
// granted (loop only): keysMade runs it. False when nothing is in flight
// (or under the known-unsafe variant, which revokes at once whatever keys
// exist so far: none).
func (d *Decode) awaitGrant(dt *decTag) bool {
	if !dt.granting || d.cfg.unsafeGrantRace {
		return false
	}
	dt.revokeAsked = true
	return true
}
