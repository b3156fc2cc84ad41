package agent

import "github.com/kvfence/kvfence/core"

// Linked reports whether prefill rank r's control link is up. An exposure's
// Assign reaches only linked ranks, so an engine that admits requests as
// soon as it starts (the C ABI's callers) waits for its writers first. A
// link its rank is closing (link_quiesce.go) counts as down: it takes no new
// request.
func (d *Decode) Linked(r core.RankID) bool {
	if d.lp.stopped() {
		return false
	}
	v := d.linkedPub.Load()
	return v != nil && (*v)[r]
}

// publishLinked (loop only) replaces the view Linked reads after a link came
// or went or began or stopped closing (rare): a caller polling for its
// writers then pays no turn of the loop (a round trip of ~45 µs of CPU on
// SGLang's scheduler thread in send_metadata). The view is as current as
// the loop call's answer was: stale the moment it returns either way, and
// an exposure to a rank that went since is refused Unavailable.
func (d *Decode) publishLinked() {
	v := make(map[core.RankID]bool, len(d.links))
	for r, l := range d.links {
		if !l.quiescing {
			v[r] = true
		}
	}
	d.linkedPub.Store(&v)
}
