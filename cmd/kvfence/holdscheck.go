package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/internal/demo"
)

func init() { register(newHoldsCheckCommand) }

// newHoldsCheckCommand: `kvfence __holds-check --log decode-0.log` checks a
// decode agent's hold log (agent/holdlog.go; the checker is internal/demo/holdcheck.go): every aborted tag went hold
// start → drain evidence from each rank, or a fence → release. Exit status
// 1 on any violation. Used by vm/late-arrival.sh.
func newHoldsCheckCommand() *cobra.Command {
	var logFile string
	var o demo.HoldCheckOptions
	var asJSON bool
	var expect int
	cmd := &cobra.Command{
		Use: "__holds-check", Hidden: true, Args: cobra.NoArgs,
		Short: "check a decode log: every hold ends by drain acknowledgement or fence, then release",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runHoldsCheck(cmd.OutOrStdout(), logFile, o, asJSON, expect)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&logFile, "log", "", "decode agent log (JSON lines)")
	fl.BoolVar(&o.AllowTimeout, "allow-timeout", false, "accept releases by the timeout bound")
	fl.IntVar(&expect, "expect", -1, "number of holds the log must show (e.g. the demo's aborts); -1: any")
	fl.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	_ = cmd.MarkFlagRequired("log")
	return cmd
}

func printHoldReport(w interface{ Write([]byte) (int, error) }, r demo.HoldReport) {
	fmt.Fprintf(w, "holds %d  drain-acks %d  commits %d  fences %d  still held %d\n", r.Holds, r.DrainAcks, r.Commits, r.Fences, r.StillHeld)
	paths := make([]string, 0, len(r.Released))
	for p := range r.Released {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		fmt.Fprintf(w, "  released %-8s %5d  held p50 %7.1f ms  p99 %7.1f ms\n", p, r.Released[p], r.HeldP50Ms[p], r.HeldP99Ms[p])
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  VIOLATION %s\n", v)
	}
	if r.OK {
		fmt.Fprintln(w, "holds check: OK (every hold: start → drain evidence or fence → release)")
	}
}

// runHoldsCheck is kvfence __holds-check: it checks the decode log at
// logFile (internal/demo CheckHolds) and fails unless every hold ended by
// its evidence (and, with expect >= 0, there were that many).
func runHoldsCheck(w io.Writer, logFile string, o demo.HoldCheckOptions, asJSON bool, expect int) error {
	f, err := os.Open(logFile)
	if err != nil {
		return err
	}
	defer f.Close()
	rep, err := demo.CheckHolds(f, o)
	if err != nil {
		return err
	}
	if expect >= 0 && rep.Holds != expect {
		rep.OK = false
		rep.Violations = append(rep.Violations, fmt.Sprintf("%d holds in the log, %d expected", rep.Holds, expect))
	}
	if asJSON {
		b, _ := json.Marshal(rep)
		fmt.Fprintln(w, string(b))
	} else {
		printHoldReport(w, rep)
	}
	if !rep.OK {
		return fmt.Errorf("holds check failed: %d violation(s) listed", len(rep.Violations))
	}
	return nil
}
