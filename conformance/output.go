package conformance

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Output file names written by Write.
const (
	FileJUnit       = "junit.xml"
	FileJSON        = "result.json"
	FileMarkdown    = "summary.md"
	FileCertificate = "certificate.json"
)

// Certificate is what an engine team checks before loading a plugin: which
// binary (sha256) passed which groups, on what link and kernel, when.
type Certificate struct {
	Certified    bool              `json:"certified"`
	Plugin       PluginInfo        `json:"plugin"`
	SuiteVersion string            `json:"suite_version"`
	Link         LinkInfo          `json:"link"`
	Kernel       string            `json:"kernel"`
	GuardWindow  string            `json:"guard_window"`
	GuardTails   float64           `json:"guard_window_in_max_tails"`
	Groups       map[string]string `json:"groups"` // group -> pass, fail, skip: reason
	Failures     []string          `json:"failures,omitempty"`
	Date         time.Time         `json:"date"`
}

// Certificate derives the certificate from the report.
func (r *Report) Certificate() Certificate {
	c := Certificate{Certified: r.Passed, Plugin: r.Plugin, SuiteVersion: r.SuiteVersion, Link: r.Link, Kernel: r.Kernel,
		GuardWindow: r.GuardWindow, GuardTails: r.GuardTails, Groups: map[string]string{}, Failures: r.Failures(), Date: r.Date}
	for _, g := range r.Groups {
		v := string(g.Outcome)
		if g.Skipped != "" {
			v += ": " + g.Skipped
		}
		c.Groups[g.Name] = v
	}
	return c
}

// Write writes the JUnit XML, JSON, Markdown and certificate files into dir.
func Write(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	cert, err := json.MarshalIndent(r.Certificate(), "", "  ")
	if err != nil {
		return err
	}
	ju, err := r.JUnit()
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{FileJSON: js, FileCertificate: cert, FileJUnit: ju, FileMarkdown: []byte(r.Markdown())} {
		if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Body    string `xml:",chardata"`
}

// JUnit renders the report as JUnit XML (one testsuite per group).
func (r *Report) JUnit() ([]byte, error) {
	all := junitSuites{Name: "kvfence-conformance " + r.Plugin.Name}
	if r.Setup != "" {
		all.Suites = append(all.Suites, junitSuite{Name: "setup", Tests: 1, Failures: 1,
			Cases: []junitCase{{Name: "setup", Classname: "conformance.setup", Failure: &junitMessage{Message: r.Setup, Body: r.Setup}}}})
	}
	for _, g := range r.Groups {
		s := junitSuite{Name: g.Name}
		if g.Skipped != "" {
			s.Cases = append(s.Cases, junitCase{Name: g.Name, Classname: "conformance." + g.Name, Skipped: &junitMessage{Message: g.Skipped}})
		}
		var d time.Duration
		for _, c := range g.Results {
			jc := junitCase{Name: c.Check, Classname: "conformance." + g.Name, Time: secs(c.Duration), SystemOut: strings.Join(c.Notes, "\n")}
			switch c.Outcome {
			case Fail:
				jc.Failure = &junitMessage{Message: "broke: " + c.Promise, Body: c.Reason}
			case Skip:
				jc.Skipped = &junitMessage{Message: c.Reason}
			}
			d += c.Duration
			s.Cases = append(s.Cases, jc)
		}
		for _, c := range s.Cases {
			s.Tests++
			if c.Failure != nil {
				s.Failures++
			}
			if c.Skipped != nil {
				s.Skipped++
			}
		}
		s.Time = secs(d)
		all.Tests, all.Failures, all.Skipped = all.Tests+s.Tests, all.Failures+s.Failures, all.Skipped+s.Skipped
		all.Suites = append(all.Suites, s)
	}
	b, err := xml.MarshalIndent(all, "", "  ")
	if err != nil {
		return nil, err
	}
	return append([]byte(xml.Header), b...), nil
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// Markdown renders a human summary.
func (r *Report) Markdown() string {
	var b strings.Builder
	verdict := "PASSED"
	if !r.Passed {
		verdict = "FAILED"
	}
	p := r.Plugin
	fmt.Fprintf(&b, "# kvfence conformance: %s %s — %s\n\n", p.Name, p.Version, verdict)
	fmt.Fprintf(&b, "- plugin: `%s` (sha256 `%s`), protocol %d (negotiated %d)\n", p.Path, p.SHA256, p.ProtocolVersion, p.Negotiated)
	c := p.Capabilities
	fmt.Fprintf(&b, "- claims: revoke=%v read=%v max_tail=%s max_batch=%d max_op_bytes=%d memory=%s\n", c.Revoke, c.Read, c.MaxTail, c.MaxBatch, c.MaxOpBytes, strings.Join(c.MemoryKinds, ","))
	fmt.Fprintf(&b, "- link: %s %s; faults: %s\n", r.Link.Kind, r.Link.Detail, strings.Join(r.Link.Faults, ", "))
	fmt.Fprintf(&b, "- guard window %s (%.2f x MaxTail); largest write %d bytes\n", r.GuardWindow, r.GuardTails, r.MaxWriteSize)
	fmt.Fprintf(&b, "- suite %s, %s, %s, took %v\n\n", r.SuiteVersion, r.Kernel, r.Date.Format(time.RFC3339), r.Duration.Round(time.Second))
	if r.Setup != "" {
		fmt.Fprintf(&b, "**Setup failed:** %s\n\n", r.Setup)
	}
	if f := r.Failures(); len(f) > 0 {
		b.WriteString("## Broken promises\n\n")
		for _, x := range f {
			fmt.Fprintf(&b, "- %s\n", x)
		}
		b.WriteString("\n")
	}
	b.WriteString("| group | check | result | promise | detail |\n|---|---|---|---|---|\n")
	for _, g := range r.Groups {
		if g.Skipped != "" {
			fmt.Fprintf(&b, "| %s | (all) | skip | | %s |\n", g.Name, md(g.Skipped))
		}
		for _, c := range g.Results {
			detail := c.Reason
			if detail == "" {
				detail = strings.Join(c.Notes, "; ")
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", g.Name, c.Check, c.Outcome, md(c.Promise), md(detail))
		}
	}
	return b.String()
}

func md(s string) string { return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s) }
