package main

import (
	"context"
	"encoding/json"
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

// newConformanceTargetCommand is the target host of a two-host run: it
// runs the target plugin here and answers the certifying host over an
// HMAC-authenticated control channel.
func newConformanceTargetCommand() *cobra.Command {
	var cfg conformance.TargetConfig
	var secretFile string
	var size uint64
	cmd := &cobra.Command{
		Use:   "target --plugin PATH --listen ADDR --secret-file FILE",
		Short: "Target host of a two-host certification (run on the second host)",
		Long: `target runs the target plugin process on this host, owns its destination memory,
and reports what it observes there to the certifying host (kvfence conformance
two-host) over a control channel authenticated with the shared secret in
--secret-file (hex or raw, at least 16 bytes; copy it to both hosts out of band).
It prints "` + conformance.TargetListeningPrefix + `ADDR" once it listens, serves one
certifying client and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runConformanceTarget(cmd, cfg, secretFile, size)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Plugin, "plugin", "", "plugin binary (the same file the certifying host certifies: its sha256 is compared)")
	f.StringVar(&cfg.Listen, "listen", "", "control channel address, host:port (port 0 picks one)")
	f.StringVar(&cfg.DataAddr, "data-addr", "", "address the plugin listens on for data (sets KVFENCE_TCP_LISTEN=ADDR:0)")
	f.StringVar(&secretFile, "secret-file", "", "file holding the shared secret of the control channel")
	f.StringVar(&cfg.Netns, "netns", "", "name of this host's network namespace, for the certificate")
	f.StringArrayVar(&cfg.Env, "env", nil, "KEY=VALUE for the target plugin process (repeatable)")
	f.Uint64Var(&size, "size", 2<<20, "destination memory, bytes")
	return cmd
}

// newConformanceTwoHostCommand certifies a plugin across two hosts (here
// two network namespaces) with kernel faults on the data link between them.
func newConformanceTwoHostCommand() *cobra.Command {
	var cfg conformance.TwoHostConfig
	var out string
	var partial bool
	cmd := &cobra.Command{
		Use:   "two-host --plugin PATH",
		Short: "Certify across two hosts (network namespaces) with kernel faults on the link between them (root)",
		Long: `two-host runs the target plugin under "kvfence conformance target" in its own
network namespace (the second host) and the initiator plugin in another, joined
by a veth pair; the control channel (HMAC-authenticated) runs on a second veth.
It drops (blackhole qdisc), slows (tbf), resets (kernel socket abort) and, with
nftables, rejects what crosses the data link, and tc netem where the kernel has
sch_netem; every outcome is judged against what the target host observes in its
memory. result.json and summary.md go to --out, certificate.json only when every
check ran and passed (a check NOT RUN is never a pass).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTwoHost(cmd, cfg, out, partial)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Plugin, "plugin", "", "plugin binary to certify")
	f.StringArrayVar(&cfg.Env, "env", nil, "KEY=VALUE for both plugin processes (repeatable)")
	f.StringVar(&out, "out", "out/conformance/two-host", "directory for result.json, summary.md, certificate.json")
	f.DurationVar(&cfg.GuardFloor, "guard-floor", conformance.DefaultGuardFloor, "shortest guard window")
	f.DurationVar(&cfg.CompletionTimeout, "completion-timeout", 30*time.Second, "longest wait for one completion")
	f.BoolVar(&partial, "partial", false, "exit 0 when every check that ran passed but some were NOT RUN (still no certificate)")
	return cmd
}

// usageErr refuses the command line (exit 2).
func usageErr(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func twoHostVerdict(cmd *cobra.Command, r *conformance.TwoHostReport, out string, partial bool) error {
	w := cmd.OutOrStdout()
	for _, c := range r.Checks {
		fmt.Fprintf(w, "%-18s %-4s %s\n", c.Name, c.Status, c.Reason)
	}
	fmt.Fprintf(w, "initiator host: %s\ntarget host:    %s\n", r.Initiator, r.Target)
	switch {
	case r.Error != "":
		return fmt.Errorf("two-host: %s", r.Error)
	case !r.Passed:
		return fmt.Errorf("two-host: %s did not pass; report in %s", r.Plugin, out)
	case !r.Certified:
		fmt.Fprintf(w, "partial run, no certificate (checks NOT RUN); report in %s\n", out)
		if partial {
			return nil
		}
		return fmt.Errorf("two-host: partial run: no certificate")
	}
	fmt.Fprintf(w, "certificate: %s\n", filepath.Join(out, "certificate.json"))
	return nil
}

// writeTwoHost writes result.json and summary.md, and certificate.json
// only for a certified run.
func writeTwoHost(out string, r *conformance.TwoHostReport) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(out, "certificate.json"))
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "result.json"), b, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "summary.md"), []byte(conformance.TwoHostMarkdown(r)), 0o644); err != nil {
		return err
	}
	if r.Certified {
		return os.WriteFile(filepath.Join(out, "certificate.json"), b, 0o644)
	}
	return nil
}

// runConformanceTarget is kvfence conformance target: the flags are
// checked, the shared secret read, and the target served until its client
// is done.
func runConformanceTarget(cmd *cobra.Command, cfg conformance.TargetConfig, secretFile string, size uint64) error {
	if cfg.Plugin == "" || cfg.Listen == "" || secretFile == "" {
		return usageErr("--plugin, --listen and --secret-file are required")
	}
	b, err := os.ReadFile(secretFile)
	if err != nil {
		return usageErr("--secret-file: %v", err)
	}
	cfg.Secret = []byte(strings.TrimSpace(string(b)))
	if len(cfg.Secret) < 16 {
		return usageErr("--secret-file: the secret must be at least 16 bytes")
	}
	if cfg.Plugin, err = filepath.Abs(cfg.Plugin); err != nil {
		return err
	}
	cfg.Size, cfg.Log = size, cmd.ErrOrStderr()
	w := cmd.OutOrStdout()
	cfg.Ready = func(addr string) { fmt.Fprintln(w, conformance.TargetListeningPrefix+addr) }
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return conformance.ServeTarget(ctx, cfg)
}

// runTwoHost is kvfence conformance two-host: the target runs under
// "kvfence conformance target" in its own namespace; the report is written
// and the verdict printed.
func runTwoHost(cmd *cobra.Command, cfg conformance.TwoHostConfig, out string, partial bool) error {
	if cfg.Plugin == "" {
		return usageErr("--plugin is required")
	}
	var err error
	if cfg.Plugin, err = filepath.Abs(cfg.Plugin); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.TargetCommand = []string{self, "conformance", "target"}
	cfg.Log = cmd.ErrOrStderr()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := conformance.CertifyTwoHost(ctx, cfg)
	if err := writeTwoHost(out, r); err != nil {
		return err
	}
	return twoHostVerdict(cmd, r, out, partial)
}
