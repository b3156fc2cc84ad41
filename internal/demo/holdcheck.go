package demo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kvfence/kvfence/agent"
)

// HoldReport is what CheckHolds found in a decode log.
type HoldReport struct {
	Holds      int                `json:"holds"`       // "hold start" lines (aborted, rejected or failed tags)
	Released   map[string]int     `json:"released"`    // by path
	DrainAcks  int                `json:"drain_acks"`  // evidence lines of kind drain-ack
	Commits    int                `json:"commits"`     // evidence: a Commit while held, or before the hold began
	Fences     int                `json:"fences"`      // "hold fence" lines
	StillHeld  int                `json:"still_held"`  // started, never released in the log
	HeldP50Ms  map[string]float64 `json:"held_p50_ms"` // by path
	HeldP99Ms  map[string]float64 `json:"held_p99_ms"`
	Violations []string           `json:"violations"` // empty = every hold ended by evidence
	OK         bool               `json:"ok"`
}

// HoldCheckOptions relax CheckHolds.
type HoldCheckOptions struct {
	// AllowTimeout accepts releases by the timeout bound (legal under I3,
	// but the safe arm of the late-arrival run must not need them).
	AllowTimeout bool
	// MaxViolations listed in the report (all are counted); default 20.
	MaxViolations int
}

type holdSeen struct {
	ranks    []string
	evidence map[string]string
	fenced   bool
	released bool
}

// CheckHolds reads a decode agent's JSON log and checks, for every tag with
// a "hold start", the order hold start → (drain evidence from every rank, or
// a fence) → hold release, exactly once; a release by path unsafe (no
// evidence at all) is a violation, and so is one by timeout unless allowed.
func CheckHolds(r io.Reader, o HoldCheckOptions) (HoldReport, error) {
	if o.MaxViolations <= 0 {
		o.MaxViolations = 20
	}
	rep := HoldReport{Released: map[string]int{}, HeldP50Ms: map[string]float64{}, HeldP99Ms: map[string]float64{}}
	nviol := 0
	viol := func(format string, a ...any) {
		nviol++
		if len(rep.Violations) < o.MaxViolations {
			rep.Violations = append(rep.Violations, fmt.Sprintf(format, a...))
		}
	}
	tags := map[string]*holdSeen{}
	var order []string
	held := map[string][]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 || b[0] != '{' {
			continue
		}
		var m map[string]any
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		msg, _ := m["@message"].(string)
		switch msg {
		case agent.HoldStartMsg, agent.HoldEvidenceMsg, agent.HoldFenceMsg, agent.HoldReleaseMsg:
		default:
			continue
		}
		tag, _ := m["tag"].(string)
		h := tags[tag]
		if msg != agent.HoldStartMsg && h == nil {
			viol("line %d: %q for tag %s before its hold start", line, msg, tag)
			continue
		}
		if h != nil && h.released {
			viol("line %d: %q for tag %s after its release", line, msg, tag)
			continue
		}
		switch msg {
		case agent.HoldStartMsg:
			if h != nil {
				viol("line %d: second hold start for tag %s", line, tag)
				continue
			}
			rep.Holds++
			h = &holdSeen{ranks: splitList(str(m["ranks"])), evidence: map[string]string{}}
			for _, e := range splitList(str(m["evidence"])) {
				if rank, kind, ok := strings.Cut(e, ":"); ok {
					h.evidence[rank] = kind
					if kind == "commit" {
						rep.Commits++
					}
				}
			}
			tags[tag] = h
			order = append(order, tag)
		case agent.HoldEvidenceMsg:
			rank := fmt.Sprint(m["rank"])
			kind := str(m["kind"])
			h.evidence[rank] = kind
			if kind == "drain-ack" {
				rep.DrainAcks++
			} else {
				rep.Commits++
			}
		case agent.HoldFenceMsg:
			h.fenced = true
			rep.Fences++
		case agent.HoldReleaseMsg:
			h.released = true
			path := str(m["path"])
			rep.Released[path]++
			if ms, ok := m["held_ms"].(float64); ok {
				held[path] = append(held[path], ms)
			}
			switch path {
			case "drained":
				for _, rk := range h.ranks {
					if h.evidence[rk] == "" {
						viol("line %d: tag %s released drained without evidence from rank %s", line, tag, rk)
					}
				}
			case "fenced":
				if !h.fenced {
					viol("line %d: tag %s released fenced before its fence", line, tag)
				}
			case "timeout":
				if !o.AllowTimeout {
					viol("line %d: tag %s released by timeout", line, tag)
				}
			default:
				viol("line %d: tag %s released by path %q: no drain, no fence", line, tag, path)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return rep, err
	}
	for _, tag := range order {
		if !tags[tag].released {
			rep.StillHeld++
			viol("tag %s: hold start, never released", tag)
		}
	}
	for path, v := range held {
		sort.Float64s(v)
		rep.HeldP50Ms[path] = v[int(0.50*float64(len(v)-1))]
		rep.HeldP99Ms[path] = v[int(0.99*float64(len(v)-1))]
	}
	if nviol > len(rep.Violations) {
		rep.Violations = append(rep.Violations, fmt.Sprintf("... %d more", nviol-len(rep.Violations)))
	}
	rep.OK = nviol == 0
	return rep, nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
