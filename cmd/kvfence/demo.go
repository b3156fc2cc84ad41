package main

import (
	"time"

	"github.com/spf13/cobra"
)

func init() { register(newDemoCommand) }

// demoLong is kvfence demo --help.
const demoLong = `kvfence demo starts a router (this process), one decode rank and two
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
corrupt page, an exposure still held, or a failed request.`

func newDemoCommand() *cobra.Command {
	var f demoFlags
	o := &f.o
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "run prefill and decode ranks as processes, abort requests mid-transfer, and check that no page ever holds another request's bytes",
		Long:  demoLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemoCommand(cmd.Context(), &f) // demo_command.go
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
	fl.StringVar(&f.fence, "fence", "auto", "per-exposure keys with revocation: auto (on when safe), on, off")
	fl.BoolVar(&o.TLS, "tls", true, "mutual TLS on the control plane (throwaway certificates)")
	fl.BoolVar(&o.Checksums, "checksums", false, "checksums at commit (prefill computes, decode checks before handoff)")
	fl.BoolVar(&f.asJSON, "json", false, "print the summary as one JSON object")
	fl.BoolVar(&f.quiet, "quiet", false, "no progress bar")
	fl.StringVar(&f.report, "report", "", "HTML report path (default: in the run directory when it is kept; none to skip)")
	fl.StringVar(&o.Dir, "dir", "", "run directory for logs and certificates, kept (default: a new temp dir, removed at the end unless --keep or the run failed)")
	fl.BoolVar(&f.keep, "keep", false, "keep the run directory (logs, throwaway certificates, the HTML report)")
	fl.Uint64Var(&o.Seed, "seed", 1, "workload seed")
	fl.DurationVar(&o.KillPrefillAfter, "kill-prefill-after", 0, "kill -9 prefill rank 2 this long into the run (crash test)")
	_ = fl.MarkHidden("kill-prefill-after")
	fl.DurationVar(&f.restartDecodeAfter, "restart-decode-after", 0, "kill -9 the decode rank this long into a first wave of --requests, start a new instance on its control address, then run a second wave (restart test)")
	_ = fl.MarkHidden("restart-decode-after")
	fl.StringVar(&o.Plugin, "plugin", "", pluginFlagHelp+"; every rank loads it. Other than tcp: no delaying proxy (--data-delay then only widens the abort window)")
	restartFenceFlags(fl, o)
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
