package conformance

import (
	"errors"
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
		return accountRun(&suite{proxyOK: true}, map[string]Outcome{familyProxy: proxyOutcome, familyNetem: Skip})
	}
	required := requiredSkips
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

// Issue 23 item 2, --netns: the link-fault checks run with the kernel's
// faults on the veth, so they are required on that link even where netem
// exists (on the old code a netns run with netem waived them: they could
// not run there); and once they carried the plugin's data, netem checks
// that could not run (no sch_netem) are not required.
func TestNetnsRequiresKernelLinkChecks(t *testing.T) {
	run := func(netem error, linkOutcome Outcome) *Report {
		netemOutcome := Pass
		if netem != nil {
			netemOutcome = Skip
		}
		s := &suite{net: &netnsPair{}, shaper: &shaper{err: netem}}
		return accountRun(s, map[string]Outcome{familyProxy: linkOutcome, familyNetem: netemOutcome})
	}
	count := requiredSkips
	if r := run(nil, Skip); count(r, familyProxy) != 6 || !r.Partial {
		t.Errorf("netns with netem, kernel link checks NOT RUN: %d required (want 6), partial %v", count(r, familyProxy), r.Partial)
	}
	noNetem := errors.New("Specified qdisc kind is unknown")
	if r := run(noNetem, Pass); count(r, familyNetem) != 0 || r.Partial {
		t.Errorf("netns without netem, kernel link checks passed: %d netem checks required (want 0), partial %v %v", count(r, familyNetem), r.Partial, r.PartialReasons)
	}
	if r := run(noNetem, Skip); count(r, familyNetem) != 2 || count(r, familyProxy) != 6 {
		t.Errorf("netns without netem, kernel faults reached nothing: %d netem, %d link checks required (want 2, 6)", count(r, familyNetem), count(r, familyProxy))
	}
}

// accountRun accounts a run of s in which every check passed except the
// link-fault checks, which came out as outcome says for their family.
func accountRun(s *suite, outcome map[string]Outcome) *Report {
	s.report, s.info = &Report{}, sdk.Info{Capabilities: sdk.Capabilities{Revoke: true}}
	for _, g := range groups() {
		gr := GroupResult{Name: g.name, Outcome: Pass}
		for _, c := range g.checks {
			res := Result{Group: g.name, Check: c.name, Outcome: Pass}
			if fam := linkFamily[g.name+"/"+c.name]; fam != "" {
				res.Outcome = outcome[fam]
				if res.Outcome == Skip {
					res.Reason = fam + " fault not applied (or not available here)"
				}
			}
			gr.Results = append(gr.Results, res)
		}
		s.report.Groups = append(s.report.Groups, gr)
	}
	s.account()
	return s.report
}

// requiredSkips counts the required checks of family fam not run in r.
func requiredSkips(r *Report, fam string) (n int) {
	for _, sk := range r.Skipped {
		if linkFamily[sk.Check] == fam && sk.Required {
			n++
		}
	}
	return n
}
