package agent

import "github.com/kvfence/kvfence/core"

// Linked reports whether prefill rank r's control link is up. An exposure's
// Assign reaches only linked ranks, so an engine that admits requests as
// soon as it starts (the C ABI's callers) waits for its writers first.
func (d *Decode) Linked(r core.RankID) bool {
	up := false
	d.lp.call(func() { up = d.links[r] != nil })
	return up
}
