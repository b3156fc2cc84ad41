package conformance

import (
	"testing"

	"github.com/kvfence/kvfence/sdk"
)

// Issue 23 item 2: starting the in-path proxy must not waive the netem
// checks when the proxy carried none of the plugin's data. A run whose
// proxy checks all came out NOT RUN (the data took another path, as real
// Mooncake's does) must list the netem checks as required skips too — on
// the old code they were waived, so --proxy auto showed 6 required checks
// not run where --proxy off showed 8. Once a proxy check reached a verdict
// (its fault met the plugin's bytes), the proxy family stands in for netem.
func TestProxyWaivesNetemOnlyWhenItCarriedData(t *testing.T) {
	run := func(proxyOutcome Outcome) *Report {
		s := &suite{proxyOK: true, worstTail: 0, report: &Report{},
			info: sdk.Info{Capabilities: sdk.Capabilities{Revoke: true}}}
		for _, g := range groups() {
			gr := GroupResult{Name: g.name, Outcome: Pass}
			for _, c := range g.checks {
				res := Result{Group: g.name, Check: c.name, Outcome: Pass}
				switch linkFamily[g.name+"/"+c.name] {
				case familyProxy:
					res.Outcome, res.Reason = proxyOutcome, "proxy stall not applied: the plugin's data does not pass through the in-path proxy"
				case familyNetem:
					res.Outcome, res.Reason = Skip, "needs --netns or --netem-dev (tc netem on the data path)"
				}
				gr.Results = append(gr.Results, res)
			}
			s.report.Groups = append(s.report.Groups, gr)
		}
		s.account()
		return s.report
	}
	required := func(r *Report, fam string) (n int) {
		for _, sk := range r.Skipped {
			if linkFamily[sk.Check] == fam && sk.Required {
				n++
			}
		}
		return n
	}
	bypassed := run(Skip)
	if got := required(bypassed, familyNetem); got != 2 || !bypassed.Partial {
		t.Errorf("proxy started but carried nothing: %d netem checks required (want 2), partial %v; skipped %+v", got, bypassed.Partial, bypassed.Skipped)
	}
	if got := required(bypassed, familyProxy); got != 6 {
		t.Errorf("proxy checks NOT RUN: %d required (want 6)", got)
	}
	carried := run(Pass)
	if got := required(carried, familyNetem); got != 0 || carried.Partial {
		t.Errorf("proxy carried the data: %d netem checks required (want 0), partial %v %v", got, carried.Partial, carried.PartialReasons)
	}
}
