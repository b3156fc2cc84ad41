package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvfence/kvfence/internal/demo"
)

// kvfence demo --restart-decode-after: the decode-restart run itself is
// internal/demo's (RunDecodeRestart); the command prints what it found.

func printRestartSummary(w io.Writer, s *demo.RestartSummary) {
	fmt.Fprintf(w, "kvfence demo — decode restart, %.1fs\n", s.Seconds)
	fmt.Fprintf(w, "  before the crash  %d requests: handed %d, failed %d, in flight at the crash %d (all failed)\n",
		s.Before, s.HandedBefore, s.FailedBefore, s.InFlightAtCrash)
	fmt.Fprintf(w, "  killed instance   %d; its %d child process(es) gone %.2fs after the kill\n", s.OldInstance, s.OldPlugins, s.OldPluginsGoneSec)
	fmt.Fprintf(w, "  new instance      %d, ready %.2fs after the kill\n", s.NewInstance, s.RestartSeconds)
	fmt.Fprintf(w, "  prefill           in doubt %.0f batches; quiesced by evidence %v\n", s.InDoubtAtPrefill, s.QuiescedByEvidence)
	fmt.Fprintf(w, "                    no batch in doubt %.2fs, no source page held %.2fs after the kill; at the end: %d requests held, %d batches unsettled\n",
		s.UnsettledClearedSec, s.SourceReleasedSec, s.PrefillHeldAtEnd, s.PrefillUnsettledAtEnd)
	fmt.Fprintf(w, "  after the restart %d requests: handed %d, failed %d\n", s.After, s.HandedAfter, s.FailedAfter)
	fmt.Fprintf(w, "  new instance      stale messages %d, pages verified %d, corrupt pages %d (written while free: %d), still held %d\n",
		s.Stale, s.PagesVerified, s.CorruptPages, s.FreeWrites, s.Unreleased)
	if s.Dir != "" {
		fmt.Fprintf(w, "  logs              %s\n", s.Dir)
	}
}

// runRestartCommand is kvfence demo --restart-decode-after: it runs the
// decode-restart run and prints its summary.
func runRestartCommand(ctx context.Context, o demo.Options, after time.Duration, asJSON, kept bool) error {
	s, err := demo.RunDecodeRestart(ctx, o, after)
	if err != nil {
		return err
	}
	if !kept {
		s.Dir = "" // removed when the command ends
	}
	if asJSON {
		b, _ := json.Marshal(s)
		fmt.Println(string(b))
		return nil
	}
	printRestartSummary(os.Stdout, s)
	return nil
}
