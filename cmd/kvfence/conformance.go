package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/sdk"
)

func init() { register(newConformanceCommand) }

// newConformanceCommand certifies a transport plugin binary: two real plugin
// processes, real faults, a certificate. It exits non-zero on any failure.
func newConformanceCommand() *cobra.Command {
	var c conformanceFlags
	cmd := &cobra.Command{
		Use:   "conformance --plugin PATH",
		Short: "Certify a transport plugin: does it tell the truth about its writes?",
		Long: `conformance loads the plugin twice (initiator and target) and checks, with real
faults (an in-path TCP proxy that delays, stalls, drops and resets; SIGSTOP,
SIGCONT and SIGKILL; kernel faults on a veth pair, and tc netem where the
kernel has it, with --netns; the same kernel faults on the link to a second
host with --two-host), that Succeeded means
the bytes are there, that FailedDefinite, Quiesce and Revoke mean nothing more
lands (a sentinel watcher on target memory over a guard window), that every batch
gets exactly one completion, and that errors carry their exact class.

Each check's result streams as it finishes. It writes junit.xml, result.json and
summary.md into --out, and certificate.json only for a complete run that passed
every check its profile (from the declared capabilities) requires; it exits
non-zero if a check failed or the run was partial (--group, or a required check
skipped; --partial makes a partial run exit 0, still without a certificate).
Groups: ` + strings.Join(conformance.GroupNames(), ", "),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runConformance(cmd, c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.cfg.Plugin, "plugin", "", "plugin binary to certify")
	f.BoolVar(&c.cfg.NetNS, "netns", false, "run initiator and target in their own network namespaces joined by a veth pair, with kernel faults on it (tbf, TCP blackhole, nftables reject, socket abort) and tc netem where the kernel has it (root)")
	f.BoolVar(&c.cfg.TwoHost, "two-host", false, "run every target plugin process on a second host (a namespace running 'kvfence conformance target', reporting its memory over an authenticated channel), with kernel faults on the data link (root)")
	f.StringSliceVar(&c.cfg.NetemDevices, "netem-dev", nil, "devices the data path crosses, for the netem faults (root; e.g. the veths under two rxe devices)")
	f.StringVar(&c.cfg.RemoteTarget, "target-control", "", "control address of a 'kvfence conformance target' running on another machine: every target process and its memory are there (the link-fault checks are NOT RUN)")
	f.StringVar(&c.secretFile, "target-secret-file", "", "the shared secret of --target-control's channel (the file given to that target)")
	f.StringVar(&c.cfg.TargetAddr, "target-addr", "", "host the initiator dials instead of the target endpoint's own address")
	f.StringVar(&c.cfg.Device, "device", "", "device for RDMA plugins (passed as KVFENCE_DEVICE, recorded in the certificate)")
	f.StringVar(&c.out, "out", "out/conformance", "directory for junit.xml, result.json, summary.md, certificate.json")
	f.StringArrayVar(&c.cfg.Env, "env", nil, "KEY=VALUE for both plugin processes (repeatable)")
	f.StringVar(&c.cfg.Proxy, "proxy", "auto", "in-path TCP fault proxy: auto, on, off")
	f.Uint64Var(&c.cfg.MaxWriteSize, "max-write", 8<<20, "largest single write checked (bytes, at most 64 MiB)")
	f.DurationVar(&c.guard, "guard", 0, "guard window after each promise (default: --guard-tails x the plugin's MaxTail, at least --guard-floor)")
	f.DurationVar(&c.cfg.GuardFloor, "guard-floor", conformance.DefaultGuardFloor, "shortest guard window, whatever MaxTail the plugin declares")
	f.DurationVar(&c.cfg.MaxWatch, "max-watch", conformance.DefaultMaxWatch, "longest wait derived from MaxTail (a plugin declaring an unbounded tail is watched this long)")
	f.BoolVar(&c.partial, "partial", false, "exit 0 after a partial run (restricted with --group, or a required check skipped); still no certificate")
	f.StringVar(&c.signKey, "sign-key", "", "ed25519 private key (PEM, PKCS#8) to sign the certificate with (see kvfence cert keygen)")
	f.IntVar(&c.cfg.GuardTails, "guard-tails", 2, "guard window in multiples of MaxTail")
	f.DurationVar(&c.cfg.CompletionTimeout, "completion-timeout", 30*time.Second, "longest wait for one completion")
	f.IntVar(&c.cfg.Repeat, "repeat", 20, "cycles of the registration idempotency check")
	f.Uint64Var(&c.cfg.PerfBytes, "perf-bytes", 64<<20, "bytes moved by the bandwidth probe")
	f.IntVar(&c.cfg.SoakBatches, "soak-batches", 5000, "the soak posts at least this many batches on one plugin pair (recorded in the certificate)")
	f.DurationVar(&c.cfg.SoakFor, "soak-for", 2*time.Minute, "and keeps going at least this long (0: the batch count alone)")
	f.StringSliceVar(&c.cfg.Groups, "group", nil, "run only these groups (repeatable)")
	f.BoolVar(&c.cfg.FailFast, "fail-fast", false, "stop at the first failed check")
	f.BoolVarP(&c.verbose, "verbose", "v", false, "add each check's notes and the plugins' stderr to the progress lines")
	cmd.AddCommand(newConformanceTargetCommand(), newConformanceTwoHostCommand())
	return cmd
}

// checkConformanceFlags refuses values that are zero where zero is no
// default (sizes, counts, timeouts), negative, or malformed, before anything
// starts.
func checkConformanceFlags(cmd *cobra.Command, cfg conformance.Config, guard time.Duration) error {
	if cfg.Plugin == "" {
		return usagef("--plugin is required")
	}
	if guard < 0 {
		return usagef("--guard %v: must not be negative", guard)
	}
	positive := map[string]bool{
		"max-write": cfg.MaxWriteSize > 0, "perf-bytes": cfg.PerfBytes > 0, "repeat": cfg.Repeat > 0,
		"guard-tails": cfg.GuardTails > 0, "completion-timeout": cfg.CompletionTimeout > 0, "guard-floor": cfg.GuardFloor > 0,
		"max-watch": cfg.MaxWatch > 0, "soak-batches": cfg.SoakBatches > 0,
	}
	for _, name := range []string{"max-write", "perf-bytes", "repeat", "guard-tails", "completion-timeout", "guard-floor", "max-watch", "soak-batches"} {
		if !positive[name] {
			return usagef("--%s %s: must be positive", name, cmd.Flags().Lookup(name).Value)
		}
	}
	if cfg.SoakFor < 0 {
		return usagef("--soak-for %v: must not be negative", cfg.SoakFor)
	}
	return nil
}

// conformanceFlags are kvfence conformance's flags.
type conformanceFlags struct {
	cfg     conformance.Config
	out     string
	guard   time.Duration
	verbose bool
	partial bool
	signKey string
	// secretFile holds --target-control's secret.
	secretFile string
}

// runConformance is kvfence conformance: the flags are checked, the suite
// runs, the report is written, and each group's outcome printed.
func runConformance(cmd *cobra.Command, f conformanceFlags) error {
	key, err := checkConformance(cmd, &f)
	if err != nil {
		return err
	}
	cfg, out := f.cfg, f.out
	w := cmd.OutOrStdout()
	cfg.Progress = w
	if f.verbose {
		cfg.Log = cmd.ErrOrStderr()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := conformance.Certify(ctx, cfg)
	if err := conformance.WriteSigned(out, r, key); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return printConformance(w, r, cfg.Plugin, out, key, f.partial)
}

// checkConformance checks everything before anything starts: the output
// directory first, then every flag, then the signing key.
func checkConformance(cmd *cobra.Command, f *conformanceFlags) (ed25519.PrivateKey, error) {
	if err := conformance.CheckOutputDir(f.out); err != nil {
		return nil, usagef("--out %s: %w", f.out, err)
	}
	if err := checkConformanceFlags(cmd, f.cfg, f.guard); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(f.cfg.Plugin)
	if err != nil {
		return nil, err
	}
	f.cfg.Plugin, f.cfg.GuardWindow = abs, f.guard
	if f.secretFile != "" {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return nil, usagef("--target-secret-file: %w", err)
		}
		f.cfg.RemoteSecret = []byte(strings.TrimSpace(string(b)))
	}
	if f.cfg.TwoHost {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		f.cfg.TargetCommand = []string{self, "conformance", "target"}
	}
	if err := f.cfg.Validate(); err != nil {
		return nil, usageError{err}
	}
	if f.signKey == "" {
		return nil, nil
	}
	key, err := sdk.LoadPrivateKey(f.signKey)
	if err != nil {
		return nil, usagef("--sign-key: %w", err)
	}
	return key, nil
}

// printConformance prints each group's outcome, the failures and the
// verdict: an error unless the run certified the plugin (or was partial
// and partial runs were allowed).
func printConformance(w io.Writer, r *conformance.Report, plugin, out string, key ed25519.PrivateKey, partial bool) error {
	for _, g := range r.Groups {
		line := fmt.Sprintf("%-22s %s", g.Name, g.Outcome)
		if g.Skipped != "" {
			line += " (" + g.Skipped + ")"
		}
		fmt.Fprintln(w, line)
	}
	for _, sk := range r.Skipped {
		if sk.Required && sk.Reason != "group not selected" {
			fmt.Fprintf(w, "SKIPPED (required) %s: %s\n", sk.Check, sk.Reason)
		}
	}
	for _, fail := range r.Failures() {
		fmt.Fprintln(w, "FAIL", fail)
	}
	switch {
	case !r.Passed:
		fmt.Fprintf(w, "not certified: %d failure(s) (%v); report in %s\n", len(r.Failures()), r.Duration.Round(time.Second), out)
		return fmt.Errorf("conformance: %s did not pass (%d failure(s))", plugin, len(r.Failures()))
	case r.Partial:
		fmt.Fprintf(w, "partial run, no certificate (%s); report in %s\n", strings.Join(r.PartialReasons, "; "), out)
		if partial {
			return nil
		}
		return fmt.Errorf("conformance: partial run (%s): no certificate", strings.Join(r.PartialReasons, "; "))
	}
	signed := "unsigned"
	if key != nil {
		signed = "signed"
	}
	fmt.Fprintf(w, "certificate: %s (certified, profile %s, %s, worst tail %s, %v)\n", filepath.Join(out, conformance.FileCertificate),
		r.Profile, signed, r.WorstTail, r.Duration.Round(time.Second))
	return nil
}
