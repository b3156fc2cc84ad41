package conformance

import (
	"fmt"
	"strings"

	"github.com/kvfence/kvfence/sdk"
)

// A certification profile is what a certificate covers, derived from the
// capabilities the plugin declares — never from what the run happened to
// manage. Every check the profile requires must run and pass; a run in
// which one was skipped (or not selected) is partial and yields no
// certificate.
const (
	// ProfileFull: initiator and target, with Granter/Revoke. Every check
	// except the information-only performance profile is required.
	ProfileFull = "full"
	// ProfileInitiatorOnly: no Granter. The suite has no way to obtain a
	// key, so the write, honesty and revocation checks it requires cannot
	// run against such a plugin alone: it is reported partial, never
	// certified, by this suite version.
	ProfileInitiatorOnly = "initiator-only"
	// ProfileGrantOnly: a target that grants keys but cannot revoke them
	// (backends whose remote writes no receiver-side call can stop: Mooncake,
	// NIXL). Every check runs except those whose promise is revocation,
	// which are not applicable; in their place the plugin must refuse Revoke
	// (unimplemented) and refuse to deregister memory that has live keys.
	// The core fences such a transport only by ending its process.
	ProfileGrantOnly = "grant-only"
)

func profileOf(c sdk.Capabilities, granter bool) string {
	switch {
	case c.Revoke:
		return ProfileFull
	case granter:
		return ProfileGrantOnly
	}
	return ProfileInitiatorOnly
}

// Link-fault families: the same promises are checked through the in-path
// proxy (loopback) or through tc netem (--netns). A run must exercise the
// family its link offers; a link that offers neither leaves the link-fault
// checks skipped, and the run partial. A proxy that was started but carried
// none of the plugin's data offers nothing: the netem family stays
// required (proxyCarriedData). On a veth link (--netns, two hosts) the
// "proxy" family's checks run with the kernel's faults on the data link
// instead (linkFault: tbf, TCP blackhole, nftables reject, socket abort),
// each with its own reached guard, so a verdict there is the same
// evidence; they are then required whether or not netem exists. Each
// check's Result.Fault names the mechanism that ran it.
const (
	familyProxy = "proxy"
	familyNetem = "netem"
)

var linkFamily = map[string]string{
	"failure-honesty/link-delayed":                 familyProxy,
	"failure-honesty/link-stalled":                 familyProxy,
	"failure-honesty/link-stalled-quiesce-at-once": familyProxy,
	"failure-honesty/link-lossy":                   familyProxy,
	"failure-honesty/link-reset":                   familyProxy,
	"failure-honesty/netem-delay-loss":             familyNetem,
	"tail/link-restored-late":                      familyProxy,
	"tail/netem-restored-late":                     familyNetem,
}

// infoOnlyGroups never count towards a certificate.
var infoOnlyGroups = map[string]bool{"performance": true}

func (s *suite) netemOK() bool { return s.shaper != nil && s.shaper.err == nil }

// required says whether the profile needs check c of group g on this link.
func (s *suite) required(g, c string) bool {
	if infoOnlyGroups[g] {
		return false
	}
	if g == "revocation" && !s.info.Capabilities.Revoke {
		return false // profile grant-only: its revocation promise is checked in handshake and memory-registration
	}
	switch linkFamily[g+"/"+c] {
	case familyProxy:
		return s.proxyOK || s.net != nil || !s.netemOK()
	case familyNetem:
		return s.netemOK() || !s.proxyCarried
	}
	return true
}

// proxyCarriedData says whether any proxy-family check ran to a verdict:
// each one passes only when its fault reached the plugin's bytes (the
// carried and reached guards), so a verdict is evidence that the proxy sits
// on the plugin's data. Only then may the proxy family stand in for the
// netem family: a proxy that carries none of the data (Mooncake's endpoint
// is its handshake port, its bytes take the library's own sockets) faults
// nothing, and the netem checks stay required.
func proxyCarriedData(ran map[string]GroupResult) bool {
	for check, fam := range linkFamily {
		if fam != familyProxy {
			continue
		}
		g, c, _ := strings.Cut(check, "/")
		for _, res := range ran[g].Results {
			if res.Check == c && (res.Outcome == Pass || res.Outcome == Fail) {
				return true
			}
		}
	}
	return false
}

// SkippedCheck is a check that did not run to a verdict, and why.
type SkippedCheck struct {
	Check    string `json:"check"` // group/check
	Reason   string `json:"reason"`
	Required bool   `json:"required"` // by the profile: the run is partial
}

// account lists every check of the suite that did not run to a verdict and
// decides whether the run is partial.
func (s *suite) account() {
	r := s.report
	r.Skipped, r.PartialReasons = nil, nil
	if len(s.cfg.Groups) > 0 {
		r.PartialReasons = append(r.PartialReasons, fmt.Sprintf("run restricted to groups %v", s.cfg.Groups))
	}
	ran := map[string]GroupResult{}
	for _, g := range r.Groups {
		ran[g.Name] = g
	}
	s.proxyCarried = (s.proxyOK || s.hosts != nil || s.net != nil) && proxyCarriedData(ran)
	missing := 0
	for _, g := range groups() {
		gr, ok := ran[g.name]
		for _, c := range g.checks {
			why, na := "", false
			switch {
			case !ok:
				why = "group not selected"
			case gr.Skipped != "":
				why = gr.Skipped
			default:
				why = "not run"
				for _, res := range gr.Results {
					if res.Check == c.name {
						why = ""
						if res.Outcome == Skip {
							why, na = res.Reason, res.NotApplicable
						}
					}
				}
			}
			if why == "" {
				continue
			}
			req := !na && s.required(g.name, c.name)
			r.Skipped = append(r.Skipped, SkippedCheck{Check: g.name + "/" + c.name, Reason: why, Required: req})
			if req {
				missing++
			}
		}
	}
	if g, ok := ran["tail"]; ok && g.Skipped == "" && s.worstTail < 0 {
		r.PartialReasons = append(r.PartialReasons, "no tail check obtained a non-Succeeded completion: the tail was not measured")
	}
	if missing > 0 {
		r.PartialReasons = append(r.PartialReasons, fmt.Sprintf("%d check(s) required by profile %q did not run (see skipped)", missing, r.Profile))
	}
	r.Partial = len(r.PartialReasons) > 0
}
