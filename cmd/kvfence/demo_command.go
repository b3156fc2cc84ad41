package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/kvfence/kvfence/internal/demo"
)

// demoFlags are kvfence demo's flags: the run's options and how the
// command presents it.
type demoFlags struct {
	o                  demo.Options
	asJSON, quiet      bool
	keep               bool
	fence, report      string
	restartDecodeAfter time.Duration
}

// runDemoCommand is kvfence demo: every flag is checked first (exit 2),
// then internal/demo runs the processes and this prints what it found.
// The safe core exits 1 if it broke its promise.
func runDemoCommand(ctx context.Context, f *demoFlags) error {
	if err := f.check(); err != nil {
		return err
	}
	if !f.quiet {
		f.o.Progress = os.Stderr
	}
	kept := f.keep || f.o.Dir != "" // a directory the user named is theirs
	cleanup, err := runDir(&f.o, "kvfence-demo-", f.keep)
	if err != nil {
		return err
	}
	if f.restartDecodeAfter > 0 {
		err := runRestartCommand(ctx, f.o, f.restartDecodeAfter, f.asJSON, kept) // demo_restart.go
		cleanup(err != nil)
		return err
	}
	s, err := demo.Run(ctx, f.o)
	if err != nil {
		cleanup(true)
		return err
	}
	failure := ""
	if f.o.Unsafe == "" || f.o.Unsafe == "safe" {
		failure = safeArmFailed(s, f.o.KillPrefillAfter > 0)
	}
	if err := f.present(s, kept, failure != ""); err != nil {
		cleanup(true)
		return err
	}
	cleanup(failure != "")
	if failure != "" {
		return fmt.Errorf("the safe core broke its promise: %s", failure)
	}
	return nil
}

// check refuses a bad command line before anything starts, in the order
// the user reads the flags' effects: the variant, the fence, the run's
// sizes (validate.go), the restart run, the plugin, the report path.
func (f *demoFlags) check() error {
	if err := checkDemoVariant(f.o.Unsafe); err != nil {
		return err
	}
	if err := f.chooseFence(); err != nil {
		return err
	}
	if err := validateRun(&f.o); err != nil {
		return err
	}
	for _, r := range demoCommandRules {
		if err := r(f); err != nil {
			return usageError{err}
		}
	}
	if err := choosePlugin(&f.o); err != nil { // plugin_flag.go
		return err
	}
	if f.report != "" && f.report != "none" {
		if err := checkWritableFile(f.report); err != nil {
			return usagef("--report: %v", err)
		}
	}
	return nil
}

// chooseFence resolves --fence. A per-exposure fence is a second line of
// defence that would catch an unsafe core's late writes: auto leaves it
// off for an unsafe run, which shows the core variant alone, as engines
// run today. The restart fence exposes the pool per instance instead.
func (f *demoFlags) chooseFence() error {
	switch f.fence {
	case "auto":
		f.o.Fence = (f.o.Unsafe == "" || f.o.Unsafe == "safe") && f.o.RestartInstances == 0
	case "on":
		f.o.Fence = true
	case "off":
		f.o.Fence = false
	default:
		return usagef("--fence must be auto, on or off, not %q", f.fence)
	}
	return nil
}

// demoCommandRules are the demo's own flags that the bench does not have:
// the decode-restart run (--restart-decode-after).
var demoCommandRules = []func(f *demoFlags) error{
	func(f *demoFlags) error {
		if f.restartDecodeAfter > 0 && f.o.RestartInstances > 0 {
			return fmt.Errorf("--restart-decode-after restarts the decode rank; it does not combine with --restart-fence-instances")
		}
		return nil
	},
	func(f *demoFlags) error {
		if f.restartDecodeAfter < 0 {
			return fmt.Errorf("--restart-decode-after must not be negative, got %v", f.restartDecodeAfter)
		}
		return nil
	},
	func(f *demoFlags) error {
		if f.restartDecodeAfter > 0 && f.o.Plugin != "" && f.o.Plugin != "tcp" {
			return fmt.Errorf("--restart-decode-after runs the embedded TCP plugin; it does not take --plugin %s", f.o.Plugin)
		}
		return nil
	},
}

// present writes the HTML report where one is wanted and prints the
// summary (one JSON object with --json).
func (f *demoFlags) present(s *demo.Summary, kept, failed bool) error {
	if path := reportPath(f.report, kept || failed, f.o.Dir); path != "" {
		if err := writeReport(path, s); err != nil {
			return err
		}
		s.Report = path
	}
	if !kept && !failed {
		s.Dir = "" // removed when the command ends
	}
	if f.asJSON {
		b, _ := json.Marshal(s)
		fmt.Println(string(b))
	} else {
		printSummary(os.Stdout, s)
	}
	return nil
}

// printSummary is the demo's summary for a person.
func printSummary(w io.Writer, s *demo.Summary) {
	fmt.Fprintf(w, "kvfence demo — variant %s, fence %v, %.1fs (%.0f req/s)\n", s.Variant, s.Fence, s.Seconds, s.RequestsPerSec)
	fmt.Fprintf(w, "  requests        %d\n  handoffs        %d\n  aborts          %d (cancels sent %d)\n", s.Requests, s.Handoffs, s.Aborts, s.CancelsSent)
	fmt.Fprintf(w, "  released        drained %d, fenced %d, timeout %d, completed %d, unsafe %d\n",
		s.ReleasedDrained, s.ReleasedFenced, s.ReleasedTimeout, s.ReleasedDone, s.ReleasedUnsafe)
	if s.TargetInstances > 0 {
		fmt.Fprintf(w, "  restart fence   %d target instances: %d restarts (each reaped before its holds were released fenced), %d live exposures failed (%.2f per restart: blast radius)\n",
			s.TargetInstances, s.TargetRestarts, s.RestartFailed, s.FailedPerRestart)
	}
	if s.Fence {
		fmt.Fprintf(w, "  revocation      %s\n", map[bool]string{true: "at the abort (the transport isolates refused writes)", false: "after the drain"}[s.RevokeAtAbort])
		fmt.Fprintf(w, "  writer-bound    %d rank key sets bound; %d admissions with unbound keys\n", s.KeysBound, s.KeysUnbound)
	}
	paths := make([]string, 0, len(s.HoldP50Ms))
	for p := range s.HoldP50Ms {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		fmt.Fprintf(w, "  hold %-9s  p50 %7.1f ms  p99 %7.1f ms  (%d)\n", p, s.HoldP50Ms[p], s.HoldP99Ms[p], len(s.Holds[p]))
	}
	fmt.Fprintf(w, "  pages verified  %d\n  corrupt pages   %d (of which written while free: %d)\n", s.PagesVerified, s.CorruptPages, s.FreeWrites)
	if s.Unreleased > 0 {
		fmt.Fprintf(w, "  STILL HELD      %d exposures at the end of the run\n", s.Unreleased)
	}
	if s.Dir != "" {
		fmt.Fprintf(w, "  logs            %s\n", s.Dir)
	} else {
		fmt.Fprintf(w, "  logs            removed (--keep keeps them)\n")
	}
	if s.Lost > 0 {
		fmt.Fprintf(w, "  FAILED          %d requests neither handed off nor cancelled", s.Lost)
		if s.RestartFailed > 0 {
			fmt.Fprintf(w, " (%d of them failed by target restarts)", min(s.RestartFailed, s.Lost))
		}
		fmt.Fprintln(w)
	}
	if s.Report != "" {
		fmt.Fprintf(w, "  report          %s\n", s.Report)
	}
}
