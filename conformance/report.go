package conformance

import (
	"fmt"
	"slices"
	"time"
)

// Outcome of one check.
type Outcome string

const (
	Pass Outcome = "pass"
	Fail Outcome = "fail"
	Skip Outcome = "skip"
)

// Result is one check's outcome. Promise names the contract promise the
// check tests, so a failure says which promise the plugin broke.
type Result struct {
	Group   string  `json:"group"`
	Check   string  `json:"check"`
	Promise string  `json:"promise"`
	Outcome Outcome `json:"outcome"`
	Reason  string  `json:"reason,omitempty"`
	// NotApplicable: skipped because the promise concerns a capability the
	// plugin does not declare; never required.
	NotApplicable bool `json:"not_applicable,omitempty"`
	// Fault names the mechanism of each fault the check injected (the
	// in-path proxy, a kernel fault on the veth link, netem, a signal), so
	// that a reader sees which one reached the plugin's data.
	Fault    []string           `json:"fault,omitempty"`
	Notes    []string           `json:"notes,omitempty"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	Duration time.Duration      `json:"duration_ns"`
}

// usedFault records that the check injected fault name (once).
func (r *Result) usedFault(name string) {
	if !slices.Contains(r.Fault, name) {
		r.Fault = append(r.Fault, name)
	}
}

// GroupResult is a group's checks; a group skipped as a whole has Skipped set.
type GroupResult struct {
	Name    string   `json:"name"`
	Outcome Outcome  `json:"outcome"`
	Skipped string   `json:"skipped,omitempty"`
	Results []Result `json:"results"`
}

// PluginInfo identifies the certified plugin.
type PluginInfo struct {
	Path            string   `json:"path"`
	SHA256          string   `json:"sha256"`
	Name            string   `json:"name"`
	Version         string   `json:"version"`
	ProtocolVersion int      `json:"protocol_version"`
	Negotiated      int      `json:"negotiated_version"`
	Capabilities    CapsJSON `json:"capabilities"`
}

// CapsJSON is sdk.Capabilities in report form.
type CapsJSON struct {
	Revoke      bool     `json:"revoke"`
	Read        bool     `json:"read"`
	MaxTail     string   `json:"max_tail"`
	MaxBatch    int      `json:"max_batch"`
	MaxOpBytes  uint64   `json:"max_op_bytes"`
	MemoryKinds []string `json:"memory_kinds"`
	WriterBound bool     `json:"writer_bound,omitempty"`
}

// LinkInfo describes the link and the faults the run could inject.
type LinkInfo struct {
	Kind       string   `json:"kind"` // loopback, loopback+proxy, veth-netns
	Device     string   `json:"device,omitempty"`
	TargetAddr string   `json:"target_addr,omitempty"`
	Faults     []string `json:"faults"`
	Detail     string   `json:"detail,omitempty"`
	// Hosts names both hosts of a two-host run and their NICs.
	Hosts *HostsInfo `json:"hosts,omitempty"`
}

// HostsInfo is the two hosts of a two-host run.
type HostsInfo struct {
	Initiator HostInfo `json:"initiator"`
	Target    HostInfo `json:"target"`
}

// Report is the whole run.
type Report struct {
	SuiteVersion string     `json:"suite_version"`
	Date         time.Time  `json:"date"`
	Kernel       string     `json:"kernel"`
	Plugin       PluginInfo `json:"plugin"`
	Link         LinkInfo   `json:"link"`
	GuardWindow  string     `json:"guard_window"`
	GuardTails   float64    `json:"guard_window_in_max_tails"`
	GuardFloor   string     `json:"guard_floor"`
	MaxWriteSize uint64     `json:"max_write_size"`
	// Profile is what a certificate would cover (from declared capabilities).
	Profile string        `json:"profile"`
	Groups  []GroupResult `json:"groups"`
	// Skipped lists every check that did not run to a verdict, with why.
	Skipped []SkippedCheck `json:"skipped,omitempty"`
	// Partial: a check the profile requires did not run, or the run was
	// restricted. A partial run never yields a certificate.
	Partial        bool     `json:"partial"`
	PartialReasons []string `json:"partial_reasons,omitempty"`
	// Passed: no check failed. Certified: passed and complete.
	Passed    bool `json:"passed"`
	Certified bool `json:"certified"`
	// WorstTail is the latest a byte landed after a non-Succeeded
	// completion, with the link restored and no Quiesce, over the tail
	// checks (measured, not declared).
	WorstTail string `json:"worst_tail_observed,omitempty"`
	// SucceededChecked counts the Succeeded completions whose every byte
	// the suite compared with target memory as they arrived, in every
	// group; SucceededUnchecked those it could not (a key on memory the
	// suite does not map, or bytes another batch overwrote from other
	// source bytes first).
	SucceededChecked   uint64 `json:"succeeded_checked"`
	SucceededUnchecked uint64 `json:"succeeded_unchecked"`
	// Soak is what the soak group ran (nil: it did not run).
	Soak     *SoakInfo     `json:"soak,omitempty"`
	Setup    string        `json:"setup_error,omitempty"`
	Duration time.Duration `json:"duration_ns"`
}

// Failures lists every failed check as "group/check: promise: reason".
func (r *Report) Failures() []string {
	var out []string
	if r.Setup != "" {
		out = append(out, "setup: "+r.Setup)
	}
	for _, g := range r.Groups {
		for _, c := range g.Results {
			if c.Outcome == Fail {
				out = append(out, fmt.Sprintf("%s/%s: broke %q: %s", g.Name, c.Check, c.Promise, c.Reason))
			}
		}
	}
	return out
}

// BrokenPromises is the set of promises some failed check names.
func (r *Report) BrokenPromises() map[string]bool {
	m := map[string]bool{}
	for _, g := range r.Groups {
		for _, c := range g.Results {
			if c.Outcome == Fail {
				m[c.Promise] = true
			}
		}
	}
	return m
}

func (r *Report) finish() {
	r.Passed = r.Setup == ""
	for i := range r.Groups {
		g := &r.Groups[i]
		if g.Skipped != "" {
			g.Outcome = Skip
			continue
		}
		g.Outcome = Pass
		for _, c := range g.Results {
			if c.Outcome == Fail {
				g.Outcome = Fail
				r.Passed = false
			}
		}
	}
	r.Certified = r.Passed && !r.Partial
}

// SoakInfo records the soak: what was asked (at least MinBatches batches
// and MinDuration) and what ran, on one plugin pair.
type SoakInfo struct {
	Batches     int    `json:"batches"`
	Bytes       uint64 `json:"bytes"`
	Duration    string `json:"duration"`
	MinBatches  int    `json:"min_batches"`
	MinDuration string `json:"min_duration"`
}
