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
	c := &holdChecker{o: o, tags: map[string]*holdSeen{}, held: map[string][]float64{},
		rep: HoldReport{Released: map[string]int{}, HeldP50Ms: map[string]float64{}, HeldP99Ms: map[string]float64{}}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		c.line++
		if m, msg, ok := holdLine(sc.Bytes()); ok {
			c.event(m, msg)
		}
	}
	if err := sc.Err(); err != nil {
		return c.rep, err
	}
	return c.finish(), nil
}

// holdChecker is CheckHolds' state while it reads the log.
type holdChecker struct {
	o     HoldCheckOptions
	rep   HoldReport
	nviol int
	tags  map[string]*holdSeen
	order []string // tags by their hold start
	held  map[string][]float64
	line  int
}

// holdLine decodes a JSON log line that is one of the hold messages.
func holdLine(b []byte) (m map[string]any, msg string, ok bool) {
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &m) != nil {
		return nil, "", false
	}
	msg, _ = m["@message"].(string)
	switch msg {
	case agent.HoldStartMsg, agent.HoldEvidenceMsg, agent.HoldFenceMsg, agent.HoldReleaseMsg:
		return m, msg, true
	}
	return nil, "", false
}

func (c *holdChecker) viol(format string, a ...any) {
	c.nviol++
	if len(c.rep.Violations) < c.o.MaxViolations {
		c.rep.Violations = append(c.rep.Violations, fmt.Sprintf(format, a...))
	}
}

// event checks one hold message against what the tag saw before.
func (c *holdChecker) event(m map[string]any, msg string) {
	tag, _ := m["tag"].(string)
	h := c.tags[tag]
	switch {
	case msg != agent.HoldStartMsg && h == nil:
		c.viol("line %d: %q for tag %s before its hold start", c.line, msg, tag)
	case h != nil && h.released:
		c.viol("line %d: %q for tag %s after its release", c.line, msg, tag)
	case msg == agent.HoldStartMsg && h != nil:
		c.viol("line %d: second hold start for tag %s", c.line, tag)
	case msg == agent.HoldStartMsg:
		c.start(tag, m)
	case msg == agent.HoldEvidenceMsg:
		kind := str(m["kind"])
		h.evidence[fmt.Sprint(m["rank"])] = kind
		if kind == "drain-ack" {
			c.rep.DrainAcks++
		} else {
			c.rep.Commits++
		}
	case msg == agent.HoldFenceMsg:
		h.fenced = true
		c.rep.Fences++
	case msg == agent.HoldReleaseMsg:
		c.release(tag, h, m)
	}
}

// start records a hold and the evidence it began with.
func (c *holdChecker) start(tag string, m map[string]any) {
	c.rep.Holds++
	h := &holdSeen{ranks: splitList(str(m["ranks"])), evidence: map[string]string{}}
	for _, e := range splitList(str(m["evidence"])) {
		if rank, kind, ok := strings.Cut(e, ":"); ok {
			h.evidence[rank] = kind
			if kind == "commit" {
				c.rep.Commits++
			}
		}
	}
	c.tags[tag] = h
	c.order = append(c.order, tag)
}

// release checks that the path a hold ended by had its evidence.
func (c *holdChecker) release(tag string, h *holdSeen, m map[string]any) {
	h.released = true
	path := str(m["path"])
	c.rep.Released[path]++
	if ms, ok := m["held_ms"].(float64); ok {
		c.held[path] = append(c.held[path], ms)
	}
	switch path {
	case "drained":
		for _, rk := range h.ranks {
			if h.evidence[rk] == "" {
				c.viol("line %d: tag %s released drained without evidence from rank %s", c.line, tag, rk)
			}
		}
	case "fenced":
		if !h.fenced {
			c.viol("line %d: tag %s released fenced before its fence", c.line, tag)
		}
	case "timeout":
		if !c.o.AllowTimeout {
			c.viol("line %d: tag %s released by timeout", c.line, tag)
		}
	default:
		c.viol("line %d: tag %s released by path %q: no drain, no fence", c.line, tag, path)
	}
}

// finish counts holds never released and the hold durations.
func (c *holdChecker) finish() HoldReport {
	for _, tag := range c.order {
		if !c.tags[tag].released {
			c.rep.StillHeld++
			c.viol("tag %s: hold start, never released", tag)
		}
	}
	for path, v := range c.held {
		sort.Float64s(v)
		c.rep.HeldP50Ms[path] = v[int(0.50*float64(len(v)-1))]
		c.rep.HeldP99Ms[path] = v[int(0.99*float64(len(v)-1))]
	}
	if c.nviol > len(c.rep.Violations) {
		c.rep.Violations = append(c.rep.Violations, fmt.Sprintf("... %d more", c.nviol-len(c.rep.Violations)))
	}
	c.rep.OK = c.nviol == 0
	return c.rep
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
