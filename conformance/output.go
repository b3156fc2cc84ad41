package conformance

import (
	"crypto/ed25519"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// Output file names written by Write.
const (
	FileJUnit       = "junit.xml"
	FileJSON        = "result.json"
	FileMarkdown    = "summary.md"
	FileCertificate = "certificate.json"
)

// Certificate is what an engine team checks before loading a plugin: which
// binary (sha256) passed every check of which profile, on what link and
// kernel, when, and the worst tail the suite measured. It is written only
// for a complete, passing run (inside an sdk.CertificateFile, signed when
// a key is given); sdk.CertificatePolicy enforces it.
type Certificate struct {
	Certified    bool       `json:"certified"`
	Profile      string     `json:"profile"`
	Plugin       PluginInfo `json:"plugin"`
	SuiteVersion string     `json:"suite_version"`
	ValidFrom    time.Time  `json:"valid_from"`  // the run's date
	ValidUntil   time.Time  `json:"valid_until"` // sdk.CertificateValidity later
	Link         LinkInfo   `json:"link"`
	Kernel       string     `json:"kernel"`
	GuardWindow  string     `json:"guard_window"`
	GuardTails   float64    `json:"guard_window_in_max_tails"`
	GuardFloor   string     `json:"guard_floor"`
	WorstTail    string     `json:"worst_tail_observed,omitempty"`
	// Soak and SucceededChecked: how long one plugin pair was kept busy,
	// and how many Succeeded were compared with target memory.
	Soak             *SoakInfo         `json:"soak,omitempty"`
	SucceededChecked uint64            `json:"succeeded_checked"`
	Groups           map[string]string `json:"groups"` // group -> pass, fail, skip: reason
	Skipped          []SkippedCheck    `json:"skipped,omitempty"`
	Failures         []string          `json:"failures,omitempty"`
	Date             time.Time         `json:"date"`
}

// Certificate derives the certificate from the report.
func (r *Report) Certificate() Certificate {
	c := Certificate{Certified: r.Certified, Profile: r.Profile, Plugin: r.Plugin, SuiteVersion: r.SuiteVersion, Link: r.Link, Kernel: r.Kernel,
		GuardWindow: r.GuardWindow, GuardTails: r.GuardTails, GuardFloor: r.GuardFloor, WorstTail: r.WorstTail,
		Soak: r.Soak, SucceededChecked: r.SucceededChecked, Groups: map[string]string{}, Skipped: r.Skipped, Failures: r.Failures(), Date: r.Date,
		ValidFrom: r.Date, ValidUntil: r.Date.Add(sdk.CertificateValidity)}
	for _, g := range r.Groups {
		v := string(g.Outcome)
		if g.Skipped != "" {
			v += ": " + g.Skipped
		}
		c.Groups[g.Name] = v
	}
	return c
}

// Write writes the JUnit XML, JSON and Markdown reports into dir, and the
// certificate only for a certified run (a stale one is removed otherwise).
func Write(dir string, r *Report) error { return WriteSigned(dir, r, nil) }

// WriteSigned is Write with the certificate signed by key (nil: unsigned).
func WriteSigned(dir string, r *Report, key ed25519.PrivateKey) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	ju, err := r.JUnit()
	if err != nil {
		return err
	}
	files := map[string][]byte{FileJSON: js, FileJUnit: ju, FileMarkdown: []byte(r.Markdown())}
	certPath := filepath.Join(dir, FileCertificate)
	if err := os.Remove(certPath); err != nil && !os.IsNotExist(err) {
		return err
	}
	if r.Certified {
		cert, err := json.Marshal(r.Certificate())
		if err != nil {
			return err
		}
		f := sdk.CertificateFile{Certificate: cert}
		if key != nil {
			f = sdk.SignCertificate(cert, key)
		}
		if files[FileCertificate], err = json.MarshalIndent(f, "", "  "); err != nil {
			return err
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// CheckOutputDir makes dir and proves it writable, so that a run that
// cannot keep its report is refused before it starts.
func CheckOutputDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
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
	verdict := "CERTIFIED"
	switch {
	case !r.Passed:
		verdict = "FAILED"
	case r.Partial:
		verdict = "PARTIAL (passed what ran; no certificate)"
	}
	p := r.Plugin
	fmt.Fprintf(&b, "# kvfence conformance: %s %s — %s\n\n", p.Name, p.Version, verdict)
	fmt.Fprintf(&b, "- plugin: `%s` (sha256 `%s`), protocol %d (negotiated %d)\n", p.Path, p.SHA256, p.ProtocolVersion, p.Negotiated)
	c := p.Capabilities
	fmt.Fprintf(&b, "- claims: revoke=%v read=%v max_tail=%s max_batch=%d max_op_bytes=%d memory=%s\n", c.Revoke, c.Read, c.MaxTail, c.MaxBatch, c.MaxOpBytes, strings.Join(c.MemoryKinds, ","))
	fmt.Fprintf(&b, "- link: %s %s; faults: %s\n", r.Link.Kind, r.Link.Detail, strings.Join(r.Link.Faults, ", "))
	if h := r.Link.Hosts; h != nil {
		fmt.Fprintf(&b, "- initiator host: %s\n- target host: %s\n", h.Initiator, h.Target)
	}
	fmt.Fprintf(&b, "- profile %s; guard window %s (%.2f x MaxTail, floor %s); largest write %d bytes\n", r.Profile, r.GuardWindow, r.GuardTails, r.GuardFloor, r.MaxWriteSize)
	if r.WorstTail != "" {
		fmt.Fprintf(&b, "- worst tail observed (bytes landing after a non-Succeeded completion, no Quiesce): %s (declared MaxTail %s)\n", r.WorstTail, c.MaxTail)
	}
	fmt.Fprintf(&b, "- Succeeded completions compared with target memory as they arrived: %d (not comparable: %d)\n", r.SucceededChecked, r.SucceededUnchecked)
	if r.Soak != nil {
		fmt.Fprintf(&b, "- soak: %d batches, %d MiB in %s on one plugin pair (asked: at least %d batches and %s)\n", r.Soak.Batches, r.Soak.Bytes>>20, r.Soak.Duration, r.Soak.MinBatches, r.Soak.MinDuration)
	}
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
	if r.Partial {
		b.WriteString("## Partial run: no certificate\n\n")
		for _, x := range r.PartialReasons {
			fmt.Fprintf(&b, "- %s\n", x)
		}
		b.WriteString("\n")
	}
	if len(r.Skipped) > 0 {
		b.WriteString("## Skipped checks\n\n")
		for _, x := range r.Skipped {
			req := ""
			if x.Required {
				req = " **(required by the profile)**"
			}
			fmt.Fprintf(&b, "- %s: %s%s\n", x.Check, x.Reason, req)
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
			if len(c.Fault) > 0 {
				detail = "fault: " + strings.Join(c.Fault, ", ") + "; " + detail
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", g.Name, c.Check, c.Outcome, md(c.Promise), md(detail))
		}
	}
	return b.String()
}

func md(s string) string { return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s) }
