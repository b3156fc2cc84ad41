package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/conformance"
)

func init() { register(newConformanceCommand) }

// newConformanceCommand certifies a transport plugin binary: two real plugin
// processes, real faults, a certificate. It exits non-zero on any failure.
func newConformanceCommand() *cobra.Command {
	var (
		cfg     conformance.Config
		out     string
		guard   time.Duration
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "conformance --plugin PATH",
		Short: "Certify a transport plugin: does it tell the truth about its writes?",
		Long: `conformance loads the plugin twice (initiator and target) and checks, with real
faults (an in-path TCP proxy that delays, stalls, drops and resets; SIGSTOP,
SIGCONT and SIGKILL; tc netem on a veth pair with --netns), that Succeeded means
the bytes are there, that FailedDefinite, Quiesce and Revoke mean nothing more
lands (a sentinel watcher on target memory over a guard window), that every batch
gets exactly one completion, and that errors carry their exact class.

It writes junit.xml, result.json, summary.md and certificate.json into --out and
exits non-zero if any check failed. Groups: ` + strings.Join(conformance.GroupNames(), ", "),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Plugin == "" {
				return fmt.Errorf("--plugin is required")
			}
			abs, err := filepath.Abs(cfg.Plugin)
			if err != nil {
				return err
			}
			cfg.Plugin, cfg.GuardWindow = abs, guard
			if verbose {
				cfg.Log = cmd.ErrOrStderr()
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			r := conformance.Certify(ctx, cfg)
			if err := conformance.Write(out, r); err != nil {
				return fmt.Errorf("writing the report: %w", err)
			}
			w := cmd.OutOrStdout()
			for _, g := range r.Groups {
				line := fmt.Sprintf("%-22s %s", g.Name, g.Outcome)
				if g.Skipped != "" {
					line += " (" + g.Skipped + ")"
				}
				fmt.Fprintln(w, line)
			}
			for _, f := range r.Failures() {
				fmt.Fprintln(w, "FAIL", f)
			}
			fmt.Fprintf(w, "certificate: %s (certified: %v, %v)\n", filepath.Join(out, conformance.FileCertificate), r.Passed, r.Duration.Round(time.Second))
			if !r.Passed {
				return fmt.Errorf("conformance: %s did not pass (%d failure(s))", cfg.Plugin, len(r.Failures()))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Plugin, "plugin", "", "plugin binary to certify")
	f.BoolVar(&cfg.NetNS, "netns", false, "run initiator and target in their own network namespaces joined by a veth pair, with tc netem faults (root)")
	f.StringVar(&cfg.TargetAddr, "target-addr", "", "host the initiator dials instead of the target endpoint's own address")
	f.StringVar(&cfg.Device, "device", "", "device for RDMA plugins (passed as KVFENCE_DEVICE, recorded in the certificate)")
	f.StringVar(&out, "out", "out/conformance", "directory for junit.xml, result.json, summary.md, certificate.json")
	f.StringArrayVar(&cfg.Env, "env", nil, "KEY=VALUE for both plugin processes (repeatable)")
	f.StringVar(&cfg.Proxy, "proxy", "auto", "in-path TCP fault proxy: auto, on, off")
	f.Uint64Var(&cfg.MaxWriteSize, "max-write", 8<<20, "largest single write checked (bytes, at most 64 MiB)")
	f.DurationVar(&guard, "guard", 0, "guard window after each promise (default: --guard-tails x the plugin's MaxTail)")
	f.IntVar(&cfg.GuardTails, "guard-tails", 2, "guard window in multiples of MaxTail")
	f.DurationVar(&cfg.CompletionTimeout, "completion-timeout", 30*time.Second, "longest wait for one completion")
	f.IntVar(&cfg.Repeat, "repeat", 20, "cycles of the registration idempotency check")
	f.Uint64Var(&cfg.PerfBytes, "perf-bytes", 64<<20, "bytes moved by the bandwidth probe")
	f.StringSliceVar(&cfg.Groups, "group", nil, "run only these groups (repeatable)")
	f.BoolVar(&cfg.FailFast, "fail-fast", false, "stop at the first failed check")
	f.BoolVarP(&verbose, "verbose", "v", false, "log each check and the plugins' stderr")
	return cmd
}
