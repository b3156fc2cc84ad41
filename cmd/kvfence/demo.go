package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/spf13/cobra"
)

func init() { register(newDemoCommand) }

func newDemoCommand() *cobra.Command {
	o := demoOptions{}
	var asJSON, quiet bool
	var fence string
	var report string
	var restartDecodeAfter time.Duration
	var keep bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "run prefill and decode ranks as processes, abort requests mid-transfer, and check that no page ever holds another request's bytes",
		Long: `kvfence demo starts a router (this process), one decode rank and two
prefill ranks (tensor parallel 2) as separate processes, each loading the TCP
plugin as its own process, with mutual TLS on the control plane and a
delaying proxy on the data path. It runs --requests requests at --concurrency,
cancels a share of them while their writes are in flight, and verifies every
page at handoff and again when the decode loop finishes with it.

With --unsafe release-on-abort the decode core frees memory as soon as a
request aborts (what engines do today): late writes land in the next
request's pages and corrupt_pages goes above zero (unbounded-timeout and
single-ack-target show too; the other variants need faults only kvfence sim
injects, and release-on-drain-ack a lying rank the demo does not have).
Known-unsafe cores exist only in a build with -tags kvfenceunsafe:

  go run -tags kvfenceunsafe ./cmd/kvfence demo --unsafe release-on-abort

--plugin chooses the transport every rank loads (default: the embedded TCP
plugin): tcp, verbs, mooncake, nixl, mori or a path. A plugin that cannot
start (a vendor plugin without its library) fails before any rank starts,
with the plugin's own line; one that cannot revoke and declares an
unbounded tail is refused with the reason (the demo could not release
aborted requests' pages in a run) unless the restart fence is on.

--restart-fence-instances N turns on the restart fence for transports that
cannot revoke (mooncake, nixl, mori): decode runs N target plugin processes
and, when a hold must end sooner than its bound (a dead writer, a hold past
--restart-fence-after), ends and reaps the instance that served it before
releasing its pages as fenced; exposures still live on that instance fail
(the blast radius, reported per restart). Decode then takes no delaying
proxy and no per-exposure keys.

Every flag is checked before anything starts (exit status 2). The run
directory (logs, throwaway certificates) is removed at the end unless
--keep, --dir, or the run failed. The safe core exits 1 if it shows a
corrupt page, an exposure still held, or a failed request.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkDemoVariant(o.Unsafe); err != nil {
				return err
			}
			switch fence {
			case "auto":
				// A per-exposure fence is a second line of defence that
				// would catch an unsafe core's late writes: the unsafe run
				// shows the core variant alone, as engines run today. The
				// restart fence exposes the pool per instance instead.
				o.Fence = (o.Unsafe == "" || o.Unsafe == "safe") && o.RestartInstances == 0
			case "on":
				o.Fence = true
			case "off":
				o.Fence = false
			default:
				return usagef("--fence must be auto, on or off, not %q", fence)
			}
			if err := o.validate(); err != nil {
				return err
			}
			if restartDecodeAfter > 0 && o.RestartInstances > 0 {
				return usagef("--restart-decode-after restarts the decode rank; it does not combine with --restart-fence-instances")
			}
			if restartDecodeAfter < 0 {
				return usagef("--restart-decode-after must not be negative, got %v", restartDecodeAfter)
			}
			if restartDecodeAfter > 0 && o.Plugin != "" && o.Plugin != "tcp" {
				return usagef("--restart-decode-after runs the embedded TCP plugin; it does not take --plugin %s", o.Plugin)
			}
			if err := o.choosePlugin(); err != nil { // plugin_flag.go
				return err
			}
			if !quiet {
				o.Progress = os.Stderr
			}
			kept := keep || o.Dir != "" // a directory the user named is theirs
			if report != "" && report != "none" {
				if err := checkWritableFile(report); err != nil {
					return usagef("--report: %v", err)
				}
			}
			cleanup, err := runDir(&o, "kvfence-demo-", keep)
			if err != nil {
				return err
			}
			if restartDecodeAfter > 0 {
				err := runRestartCommand(cmd.Context(), o, restartDecodeAfter, asJSON, kept) // demo_restart.go
				cleanup(err != nil)
				return err
			}
			s, err := runDemo(cmd.Context(), o)
			if err != nil {
				cleanup(true)
				return err
			}
			failure := ""
			if o.Unsafe == "" || o.Unsafe == "safe" {
				failure = safeArmFailed(s, o.KillPrefillAfter > 0)
			}
			if path := reportPath(report, kept || failure != "", o.Dir); path != "" {
				if err := writeReport(path, s); err != nil {
					cleanup(true)
					return err
				}
				s.Report = path
			}
			if !kept && failure == "" {
				s.Dir = "" // removed below
			}
			if asJSON {
				b, _ := json.Marshal(s)
				fmt.Println(string(b))
			} else {
				printSummary(os.Stdout, s)
			}
			cleanup(failure != "")
			if failure != "" {
				return fmt.Errorf("the safe core broke its promise: %s", failure)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&o.Requests, "requests", 1024, "requests to run")
	fl.IntVar(&o.Concurrency, "concurrency", 256, "requests in flight")
	fl.IntVar(&o.MinPages, "min-pages", 4, "fewest pages per request")
	fl.IntVar(&o.MaxPages, "max-pages", 16, "most pages per request")
	fl.Float64Var(&o.AbortShare, "abort-share", 0.25, "share of requests cancelled mid-transfer")
	fl.DurationVar(&o.PageEvery, "page-every", 8*time.Millisecond, "simulated prefill compute per page")
	fl.DurationVar(&o.DecodeFor, "decode-for", time.Second, "how long the decode loop keeps a request before finishing it (it is verified again then: a late write that lands meanwhile is caught)")
	fl.DurationSliceVar(&o.Delays, "data-delay", []time.Duration{600 * time.Millisecond, time.Millisecond}, "delaying proxy: delay of data connection k (cyclic)")
	fl.StringVar(&o.Unsafe, "unsafe", "", "run a known-unsafe core the demo can show: release-on-abort, unbounded-timeout or single-ack-target (only in a build with -tags kvfenceunsafe)")
	fl.StringVar(&fence, "fence", "auto", "per-exposure keys with revocation: auto (on when safe), on, off")
	fl.BoolVar(&o.TLS, "tls", true, "mutual TLS on the control plane (throwaway certificates)")
	fl.BoolVar(&o.Checksums, "checksums", false, "checksums at commit (prefill computes, decode checks before handoff)")
	fl.BoolVar(&asJSON, "json", false, "print the summary as one JSON object")
	fl.BoolVar(&quiet, "quiet", false, "no progress bar")
	fl.StringVar(&report, "report", "", "HTML report path (default: in the run directory when it is kept; none to skip)")
	fl.StringVar(&o.Dir, "dir", "", "run directory for logs and certificates, kept (default: a new temp dir, removed at the end unless --keep or the run failed)")
	fl.BoolVar(&keep, "keep", false, "keep the run directory (logs, throwaway certificates, the HTML report)")
	fl.Uint64Var(&o.Seed, "seed", 1, "workload seed")
	fl.DurationVar(&o.KillPrefillAfter, "kill-prefill-after", 0, "kill -9 prefill rank 2 this long into the run (crash test)")
	_ = fl.MarkHidden("kill-prefill-after")
	fl.DurationVar(&restartDecodeAfter, "restart-decode-after", 0, "kill -9 the decode rank this long into a first wave of --requests, start a new instance on its control address, then run a second wave (restart test)")
	_ = fl.MarkHidden("restart-decode-after")
	fl.StringVar(&o.Plugin, "plugin", "", pluginFlagHelp+"; every rank loads it. Other than tcp: no delaying proxy (--data-delay then only widens the abort window)")
	restartFenceFlags(fl, &o)
	// Advanced (the Soft-RoCE VM's late-arrival step, vm/late-arrival.sh):
	// the external plugin's environment per role.
	fl.StringArrayVar(&o.PrefillEnv, "prefill-plugin-env", nil, "K=V for the prefill ranks' plugin environment (repeatable)")
	fl.StringArrayVar(&o.DecodeEnv, "decode-plugin-env", nil, "K=V for the decode rank's plugin environment (repeatable)")
	fl.StringSliceVar(&o.DataHosts, "data-hosts", nil, "decode advertises its data endpoint once per host (one QP per lane with the verbs plugin)")
	fl.StringArrayVar(&o.AgentArgs, "agent-arg", nil, "extra flag for every rank's __agent process, e.g. --agent-arg=--lease=5s (repeatable)")
	for _, n := range []string{"prefill-plugin-env", "decode-plugin-env", "data-hosts", "agent-arg"} {
		_ = fl.MarkHidden(n)
	}
	return cmd
}

func printSummary(w io.Writer, s *demoSummary) {
	fmt.Fprintf(w, "kvfence demo — variant %s, fence %v, %.1fs (%.0f req/s)\n", s.Variant, s.Fence, s.Seconds, s.RequestsPerSec)
	fmt.Fprintf(w, "  requests        %d\n  handoffs        %d\n  aborts          %d (cancels sent %d)\n", s.Requests, s.Handoffs, s.Aborts, s.CancelsSent)
	fmt.Fprintf(w, "  released        drained %d, fenced %d, timeout %d, completed %d, unsafe %d\n",
		s.ReleasedDrained, s.ReleasedFenced, s.ReleasedTimeout, s.ReleasedDone, s.ReleasedUnsafe)
	if s.TargetInstances > 0 {
		fmt.Fprintf(w, "  restart fence   %d target instances: %d restarts (each reaped before its holds were released fenced), %d live exposures failed (%.2f per restart: blast radius)\n",
			s.TargetInstances, s.TargetRestarts, s.RestartFailed, s.FailedPerRestart)
	}
	if s.Fence {
		fmt.Fprintf(w, "  writer-bound    %d rank key sets bound; %d admissions with unbound keys\n", s.KeysBound, s.KeysUnbound)
	}
	paths := make([]string, 0, len(s.HoldP50Ms))
	for p := range s.HoldP50Ms {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		fmt.Fprintf(w, "  hold %-9s  p50 %7.1f ms  p99 %7.1f ms  (%d)\n", p, s.HoldP50Ms[p], s.HoldP99Ms[p], len(s.holds[p]))
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
