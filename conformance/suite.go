package conformance

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// group is a named set of checks that share a precondition. needs returns
// why the group cannot run against this plugin (csi-sanity style: the skip
// and its reason go into the report), or "".
type group struct {
	name   string
	needs  func(s *suite) string
	checks []check
}

// check is one named check; run returns nil when the plugin keeps promise.
// A check that can only be skipped returns errSkip(reason).
type check struct {
	name    string
	promise string
	run     func(ctx context.Context, s *suite, r *Result) error
}

// brokeError attributes a failure to a promise other than the check's own
// (a check about registration that finds a Succeeded write without its
// bytes reports the Succeeded promise as broken).
type brokeError struct {
	promise string
	err     error
}

func (e brokeError) Error() string { return e.err.Error() }
func (e brokeError) Unwrap() error { return e.err }

func broke(promise string, err error) error {
	if err == nil {
		return nil
	}
	return brokeError{promise, err}
}

type skipError struct {
	reason string
	na     bool // the promise does not apply to what the plugin declares
}

func (e skipError) Error() string { return "skipped: " + e.reason }

// errSkip: the check could not run here (a missing fault injector, an
// unsupported claim); if the profile requires it, the run is partial.
func errSkip(format string, args ...any) error {
	return skipError{reason: fmt.Sprintf(format, args...)}
}

// errNotApplicable: the promise concerns a capability the plugin does not
// declare (WriterBound, say); no profile requires it.
func errNotApplicable(format string, args ...any) error {
	return skipError{reason: "not applicable: " + fmt.Sprintf(format, args...), na: true}
}

// groups is the suite, in order. The main session is shared by the groups
// that do not break their link; the others start pairs of their own.
func groups() []group {
	return []group{
		handshakeGroup(),
		registrationGroup(),
		writeGroup(),
		accountingGroup(),
		honestyGroup(),
		revocationGroup(),
		refusalsGroup(),
		crashGroup(),
		badInputGroup(),
		contractGroup(),
		tailGroup(),
		soakGroup(),
		perfGroup(),
	}
}

// GroupNames lists the groups in run order.
func GroupNames() []string {
	var out []string
	for _, g := range groups() {
		out = append(out, g.name)
	}
	return out
}

// suite is one run: the configuration, the plugin's identity, the link,
// and the shared session.
type suite struct {
	cfg     Config
	sum     []byte
	info    sdk.Info
	granter bool // the target offered a Granter (checked against the claim)
	neg     int
	guard   time.Duration
	proxyOK bool
	// proxyCarried: a proxy-family check reached a verdict, so the proxy
	// carried the plugin's data (set by account; see proxyCarriedData).
	proxyCarried bool
	net          *netnsPair
	shaper       *shaper // netem on the data path (nil: none)
	main         *session
	mainErr      error // renewMain could not start a fresh pair
	contract     *contractPair
	stopped      string // set by FailFast after the first failure
	report       *Report
	// worstTail is the latest landing after a non-Succeeded completion
	// that the tail checks saw (-1: none measured).
	worstTail time.Duration
	// verdicts accounts for the check of every Succeeded (verify.go).
	verdicts verdicts
	// remote is the control channel to the target host of a two-host run
	// (nil: the target runs here); hosts holds that run's own state.
	remote *ctlConn
	hosts  *hostPair
	memErr stickyErr // a failed operation on the target host's memory
}

func needsGranter(s *suite) string {
	if !s.granter {
		return "the plugin offers no Granter: the suite has no way to obtain a key to write under"
	}
	return ""
}

// notRevoking marks a check whose promise is about revocation as not
// applicable to a plugin that does not claim Revoke (profile grant-only);
// such a plugin's own promise — Revoke refuses, deregistration with live keys
// refuses — is checked by revoke-claim-matches-granter and
// memory-registration/deregister-live-key.
func notRevoking(s *suite) error {
	if s.info.Capabilities.Revoke {
		return nil
	}
	return errNotApplicable("the plugin does not claim Revoke (profile %s)", ProfileGrantOnly)
}

// watchedTail is the plugin's MaxTail as far as the suite can watch it:
// capped at MaxWatch for backends that declare an unbounded tail.
func (s *suite) watchedTail() time.Duration {
	return min(s.info.Capabilities.MaxTail, s.cfg.MaxWatch)
}

// needsLinkFaults: the link-fault checks need the in-path proxy (loopback)
// or the kernel's faults on a veth data link (--netns, --two-host).
func needsLinkFaults(s *suite) string {
	if !s.proxyOK && s.hosts == nil && s.net == nil {
		return "no in-path TCP proxy on this link (the endpoint address is not host:port) and no veth link of the suite's own (--netns, --two-host) to put kernel faults on"
	}
	return ""
}

// setup prepares the run: identity, link, the shared session.
func setup(ctx context.Context, cfg Config) (*suite, error) {
	cfg = cfg.withDefaults()
	s := &suite{cfg: cfg, worstTail: -1, report: &Report{SuiteVersion: SuiteVersion, Date: time.Now().UTC(), Kernel: kernel(), MaxWriteSize: cfg.MaxWriteSize}}
	s.report.Plugin.Path = cfg.Plugin
	sum, err := sdk.FileSHA256(cfg.Plugin)
	if err != nil {
		return s, err
	}
	s.sum = sum
	s.report.Plugin.SHA256 = hex.EncodeToString(sum)
	switch {
	case cfg.TwoHost:
		if err := s.startHosts(); err != nil {
			return s, fmt.Errorf("two hosts: %w", err)
		}
	case cfg.RemoteTarget != "":
		if err := s.dialHosts(); err != nil {
			return s, fmt.Errorf("target host %s: %w", cfg.RemoteTarget, err)
		}
	case cfg.NetNS:
		if s.net, err = newNetnsPair(); err != nil {
			return s, fmt.Errorf("netns: %w", err)
		}
		s.shaper = s.net.shaper
	}
	if len(cfg.NetemDevices) > 0 {
		s.shaper = newShaper(nil, cfg.NetemDevices...)
	}
	// One pair first, to learn what the plugin claims.
	probe, err := s.open(ctx, "target", cfg.TargetEnv)
	if err != nil {
		return s, err
	}
	s.info, s.neg, s.granter = probe.info, probe.neg, probe.g != nil
	ep, eperr := probe.t.LocalEndpoint(ctx)
	probe.close()
	if eperr != nil {
		return s, fmt.Errorf("LocalEndpoint: %w", eperr)
	}
	_, _, splitErr := net.SplitHostPort(ep.Address)
	switch cfg.Proxy {
	case "on":
		if splitErr != nil {
			return s, fmt.Errorf("--proxy on, but the endpoint address %q is not host:port", ep.Address)
		}
		s.proxyOK = true
	case "auto":
		s.proxyOK = splitErr == nil && s.net == nil && s.hosts == nil && len(cfg.NetemDevices) == 0
	}
	s.guard = cfg.GuardWindow
	if s.guard <= 0 {
		s.guard = max(min(time.Duration(cfg.GuardTails)*s.info.Capabilities.MaxTail, cfg.MaxWatch), cfg.GuardFloor)
	}
	s.describe()
	if needsGranter(s) == "" {
		if s.main, err = s.newSession(ctx, true); err != nil {
			return s, err
		}
	}
	return s, nil
}

func (s *suite) describe() {
	r, c := s.report, s.info.Capabilities
	r.Plugin.Name, r.Plugin.Version, r.Plugin.ProtocolVersion, r.Plugin.Negotiated = s.info.Name, s.info.Version, s.info.ProtocolVersion, s.neg
	r.Plugin.Capabilities = CapsJSON{Revoke: c.Revoke, Read: c.Read, MaxTail: c.MaxTail.String(), MaxBatch: c.MaxBatch, MaxOpBytes: c.MaxOpBytes, WriterBound: c.WriterBound}
	for _, k := range c.MemoryKinds {
		r.Plugin.Capabilities.MemoryKinds = append(r.Plugin.Capabilities.MemoryKinds, k.String())
	}
	r.GuardWindow, r.GuardFloor = s.guard.String(), s.cfg.GuardFloor.String()
	r.Profile = profileOf(c, s.granter)
	if c.MaxTail > 0 {
		r.GuardTails = float64(s.guard) / float64(c.MaxTail)
	}
	l := &r.Link
	l.Device, l.TargetAddr = s.cfg.Device, s.cfg.TargetAddr
	l.Faults = []string{"SIGSTOP/SIGCONT target", "SIGKILL initiator", "SIGKILL target", "target memory deregistered"}
	switch {
	case s.hosts != nil && s.net == nil:
		l.Kind = "two-host"
		l.Detail = "control: " + s.hosts.control + "; no link faults (a target host on another machine)"
		l.Hosts = &HostsInfo{Initiator: localHost(""), Target: s.hosts.targetHost()}
	case s.hosts != nil:
		l.Kind = "two-host"
		l.Detail = "data: " + s.net.describe() + "; control: " + s.hosts.control
		l.Hosts = &HostsInfo{Initiator: s.net.iniHost(), Target: s.hosts.targetHost()}
		l.Faults = append(l.Faults, kernelFaultNames()...)
	case s.net != nil:
		l.Kind = "veth-netns"
		l.Detail = s.net.describe()
		l.Faults = append(l.Faults, kernelFaultNames()...)
	case s.shaper != nil:
		l.Kind = "device"
		l.Detail = "netem on " + strings.Join(s.shaper.devs, ", ")
	case s.proxyOK:
		l.Kind = "loopback+proxy"
		l.Faults = append(l.Faults, "proxy delay", "proxy stall", "proxy drop", "proxy reset")
	default:
		l.Kind = "loopback"
	}
	switch {
	case s.netemOK():
		l.Faults = append(l.Faults, "netem delay", "netem loss")
	case s.shaper != nil:
		l.Detail += "; tc netem unavailable: " + s.shaper.err.Error()
	}
}

func (s *suite) nsFor(role string) string {
	if s.net == nil {
		return ""
	}
	return s.net.nsFor(role)
}

func (s *suite) close() {
	s.main.close()
	s.contract.close()
	if s.hosts != nil {
		s.hosts.close() // the namespaces with it
	} else if s.net != nil {
		s.net.close()
	}
}

func (s *suite) logf(format string, args ...any) {
	fmt.Fprintf(s.cfg.Log, "conformance: "+format+"\n", args...)
}

// runCheck runs one check with a bound and turns its error into a Result.
func (s *suite) runCheck(ctx context.Context, g group, c check) Result {
	r := Result{Group: g.name, Check: c.name, Promise: c.promise}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	_, before := s.liesSince(0)
	_ = s.memErr.take()
	err := s.renewMain(ctx, &r)
	if err == nil {
		err = c.run(ctx, s, &r)
	}
	r.Duration = time.Since(start)
	if merr := s.memErr.take(); merr != nil {
		// The check's view of target memory is incomplete: its verdict,
		// pass or fail, rests on a read or fill that did not happen.
		err = fmt.Errorf("target host memory: %w (the check's verdict is void)", merr)
	}
	// A Succeeded without its bytes fails the check it happened in, whatever
	// the check itself looked at.
	if lie, _ := s.liesSince(before); lie != nil {
		var sk skipError
		if err == nil || asSkip(err, &sk) {
			err = lie
		} else if !errors.As(err, new(brokeError)) {
			err = fmt.Errorf("%w; and %w", lie, err)
		}
	}
	var sk skipError
	switch {
	case err == nil:
		r.Outcome = Pass
	case asSkip(err, &sk):
		r.Outcome, r.Reason, r.NotApplicable = Skip, sk.reason, sk.na
	default:
		r.Outcome, r.Reason = Fail, err.Error()
		var b brokeError
		if errors.As(err, &b) {
			r.Promise = b.promise
		}
	}
	s.progress(r)
	return r
}

// progress streams one line per finished check (elapsed time, verdict, and
// for a failure the promise broken); the detail log adds the notes.
func (s *suite) progress(r Result) {
	line := fmt.Sprintf("%-4s %s/%s (%v)", strings.ToUpper(string(r.Outcome)), r.Group, r.Check, r.Duration.Round(time.Millisecond))
	switch r.Outcome {
	case Fail:
		line += fmt.Sprintf(": broke %q: %s", r.Promise, r.Reason)
	case Skip:
		line += ": " + r.Reason
	}
	fmt.Fprintln(s.cfg.Progress, line)
	for _, n := range r.Notes {
		s.logf("  %s/%s: %s", r.Group, r.Check, n)
	}
}

// renewMain replaces the shared session when an earlier check left a
// batch on it that may still move bytes (its Quiesce gave no evidence):
// such bytes, landing during a later check on the same memory, would be
// judged as that check's batch's (seen with real Mooncake: a stalled
// batch's bytes landing after the next check's Quiesce). Ending the old
// pair's processes is the fence the core uses for such a plugin, and the
// new pair has memory of its own.
func (s *suite) renewMain(ctx context.Context, r *Result) error {
	if s.mainErr != nil {
		return s.mainErr
	}
	if s.main == nil || !s.main.unsettled {
		return nil
	}
	s.main.close()
	var err error
	if s.main, err = s.newSession(ctx, true); err != nil {
		s.mainErr = fmt.Errorf("no fresh plugin pair (the previous one had batches in doubt): %w", err)
		return s.mainErr
	}
	r.Notes = append(r.Notes, "on a fresh plugin pair: an earlier check left batches in doubt (Quiesce gave no evidence), whose bytes may still land in the old pair's memory")
	return nil
}

// finish accounts for what did not run and settles the verdict.
func (s *suite) finish(start time.Time) {
	if s.worstTail >= 0 {
		s.report.WorstTail = s.worstTail.String()
	}
	s.verdicts.mu.Lock()
	s.report.SucceededChecked, s.report.SucceededUnchecked = s.verdicts.checked, s.verdicts.blind
	s.verdicts.mu.Unlock()
	s.report.Duration = time.Since(start)
	s.account()
	s.report.finish()
}

// asSkip finds a skip anywhere in err's chain: a fault that could not be
// applied is reported by the fault, deep inside the check.
func asSkip(err error, sk *skipError) bool {
	return errors.As(err, sk)
}

func (s *suite) groupSkip(g group) string {
	if g.needs == nil {
		return ""
	}
	return g.needs(s)
}

// Certify runs the suite without a testing.T and returns its report. The
// report says Passed=false on any failure (setup included); the error is
// only for a run that could not produce a report.
func Certify(ctx context.Context, cfg Config) *Report {
	start := time.Now()
	if err := cfg.Validate(); err != nil {
		r := &Report{SuiteVersion: SuiteVersion, Date: time.Now().UTC(), Setup: "invalid configuration: " + err.Error()}
		r.Plugin.Path = cfg.Plugin
		r.finish()
		return r
	}
	s, err := setup(ctx, cfg)
	defer s.close()
	if err != nil {
		s.report.Setup = err.Error()
		s.report.finish()
		return s.report
	}
	for _, g := range groups() {
		if !s.cfg.wants(g.name) {
			continue
		}
		gr := GroupResult{Name: g.name}
		if why := s.groupSkip(g); why != "" {
			gr.Skipped = why
			fmt.Fprintf(s.cfg.Progress, "SKIP %s (whole group): %s\n", g.name, why)
		} else if s.stopped != "" {
			gr.Skipped = "not run: " + s.stopped
		} else {
			for _, c := range g.checks {
				if s.stopped != "" {
					break
				}
				res := s.runCheck(ctx, g, c)
				gr.Results = append(gr.Results, res)
				if res.Outcome == Fail && s.cfg.FailFast {
					s.stopped = "fail-fast after " + g.name + "/" + c.name
				}
			}
		}
		s.report.Groups = append(s.report.Groups, gr)
	}
	s.finish(start)
	return s.report
}

// Run runs the suite as named subtests of t (one per group, one per check
// inside it), skipping by declared capability with the reason, and returns
// the report.
func Run(t *testing.T, cfg Config) *Report {
	t.Helper()
	start := time.Now()
	ctx := context.Background()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("conformance: %v", err)
	}
	s, err := setup(ctx, cfg)
	t.Cleanup(s.close)
	if err != nil {
		s.report.Setup = err.Error()
		s.report.finish()
		t.Fatalf("conformance setup: %v", err)
		return s.report
	}
	for _, g := range groups() {
		if !s.cfg.wants(g.name) {
			continue
		}
		gr := GroupResult{Name: g.name}
		t.Run(g.name, func(t *testing.T) {
			if why := s.groupSkip(g); why != "" {
				gr.Skipped = why
				t.Skip(why)
			}
			for _, c := range g.checks {
				t.Run(c.name, func(t *testing.T) {
					r := s.runCheck(ctx, g, c)
					gr.Results = append(gr.Results, r)
					switch r.Outcome {
					case Fail:
						t.Errorf("broke %q: %s", r.Promise, r.Reason)
					case Skip:
						t.Skip(r.Reason)
					}
					for _, n := range r.Notes {
						t.Log(n)
					}
				})
			}
		})
		s.report.Groups = append(s.report.Groups, gr)
	}
	s.finish(start)
	return s.report
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	v, _ := os.ReadFile("/proc/sys/kernel/version")
	if err != nil {
		return "unknown"
	}
	return "Linux " + strings.TrimSpace(string(b)) + " " + strings.TrimSpace(string(v))
}
