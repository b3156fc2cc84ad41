package agent

import "github.com/kvfence/kvfence/core"

// Linked reports whether prefill rank r's control link is up. An exposure's
// Assign reaches only linked ranks, so an engine that admits requests as
// soon as it starts (the C ABI's callers) waits for its writers first. A
// link its rank is closing (link_quiesce.go) counts as down: it takes no new
// request.
func (d *Decode) Linked(r core.RankID) bool {
	up := false
	d.lp.call(func() {
		l := d.links[r]
		up = l != nil && !l.quiescing
	})
	return up
}
