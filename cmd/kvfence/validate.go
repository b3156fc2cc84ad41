package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/internal/demo"
	"github.com/kvfence/kvfence/sdk"
)

// Bounds of a demo or bench run, checked before any process starts. The
// decode pool the demo starts has demo.DefaultSlots slots (__agent --slots); a
// request larger than that could never be admitted and would wait forever.
const (
	maxRequests    = 1_000_000
	maxConcurrency = 4096
	maxSlots       = 1 << 20
	maxDelayFlag   = time.Minute
)

// demoShowable are the known-unsafe cores whose bug the demo's faults
// (cancels while delayed writes are in flight) make visible as corrupt
// pages. The others need faults only the simulation injects (failed sends,
// lost or duplicated messages, restarts, other writers' tails): the demo
// would report "corrupt pages 0" for them as if they were safe.
var demoShowable = []knownunsafe.Variant{knownunsafe.ReleaseOnAbort, knownunsafe.UnboundedTimeout, knownunsafe.SingleAckTarget}

// demoLacks says, for a variant whose bug needs something the demo does not
// have, what that is (the others need the simulation's injected faults).
var demoLacks = map[string]string{
	knownunsafe.ReleaseOnDrainAck.Name(): "it needs a lying prefill rank that acks its drain and keeps writing, and the demo's ranks are honest (TestLyingRankCannotWriteAfterRelease in agent/ has one)",
}

// checkDemoVariant refuses what this build or this demo cannot run.
func checkDemoVariant(name string) error {
	v, err := knownunsafe.ForAgents(name)
	if err != nil {
		return usageError{err}
	}
	if v.IsSafe() {
		return nil
	}
	names := make([]string, len(demoShowable))
	for i, s := range demoShowable {
		if s.Is(v) {
			return nil
		}
		names[i] = s.Name()
	}
	why := "the demo's faults cannot show this variant's bug"
	if lacks, ok := demoLacks[v.Name()]; ok {
		why = "the demo cannot show this variant's bug: " + lacks
	}
	return usagef("--unsafe %s: %s (it would report corrupt pages 0 as if safe); the demo shows %s, and `kvfence sim --variant %s` shows this one",
		name, why, strings.Join(names, ", "), name)
}

// demoRule is one check of a demo or bench run's options, named by the
// flag it is about. Every rule runs before any process starts; the first
// refusal is a usage error (one line, exit 2).
type demoRule struct {
	flag  string
	check func(o *demo.Options) error // nil when the options are fine
}

var demoRules = []demoRule{
	{"KVFENCE_ASYNC_POST", func(*demo.Options) error { _, err := sdk.AsyncPostFromEnv(false); return err }},
	{"requests", func(o *demo.Options) error { return intIn("requests", o.Requests, 1, maxRequests) }},
	{"concurrency", func(o *demo.Options) error { return intIn("concurrency", o.Concurrency, 1, maxConcurrency) }},
	{"min-pages", func(o *demo.Options) error {
		if o.MinPages < 1 {
			return fmt.Errorf("--min-pages must be at least 1, got %d", o.MinPages)
		}
		return nil
	}},
	{"max-pages", func(o *demo.Options) error {
		if o.MaxPages < o.MinPages {
			return fmt.Errorf("--max-pages (%d) must not be below --min-pages (%d)", o.MaxPages, o.MinPages)
		}
		return nil
	}},
	{"slots", func(o *demo.Options) error {
		if o.Slots < 0 || o.Slots > maxSlots {
			return fmt.Errorf("--slots must be between 1 and %d, got %d", maxSlots, o.Slots)
		}
		return nil
	}},
	{"max-pages", func(o *demo.Options) error {
		if o.MaxPages > o.PoolSlots() {
			return fmt.Errorf("--max-pages %d exceeds the decode pool the run starts (%d slots): such a request could never be admitted", o.MaxPages, o.PoolSlots())
		}
		return nil
	}},
	{"abort-share", func(o *demo.Options) error {
		if math.IsNaN(o.AbortShare) || o.AbortShare < 0 || o.AbortShare > 1 {
			return fmt.Errorf("--abort-share must be between 0 and 1, got %v", o.AbortShare)
		}
		return nil
	}},
	{"page-every", func(o *demo.Options) error { return upToMaxDelay("page-every", o.PageEvery) }},
	{"decode-for", func(o *demo.Options) error { return upToMaxDelay("decode-for", o.DecodeFor) }},
	{"kill-prefill-after", func(o *demo.Options) error {
		if o.KillPrefillAfter < 0 {
			return fmt.Errorf("--kill-prefill-after must not be negative, got %v", o.KillPrefillAfter)
		}
		return nil
	}},
	{"restart-fence-instances", func(o *demo.Options) error {
		if o.RestartInstances < 0 || o.RestartInstances > agent.MaxTargets {
			return fmt.Errorf("--restart-fence-instances must be between 0 (off) and %d, got %d", agent.MaxTargets, o.RestartInstances)
		}
		return nil
	}},
	{"restart-fence-after", func(o *demo.Options) error {
		if o.RestartInstances > 0 && (o.RestartAfter <= 0 || o.RestartAfter > maxDelayFlag) {
			return fmt.Errorf("--restart-fence-after must be between 0 (excluded) and %v, got %v", maxDelayFlag, o.RestartAfter)
		}
		return nil
	}},
	{"fence", func(o *demo.Options) error {
		if o.RestartInstances > 0 && o.Fence {
			return fmt.Errorf("--restart-fence-instances exposes decode's pool under one key per target instance (the instance's process is the fence): it does not take --fence on")
		}
		return nil
	}},
	{"data-delay", func(o *demo.Options) error { return delaysIn(o.Delays) }},
	{"dir", func(o *demo.Options) error {
		if o.Dir == "" {
			return nil
		}
		if err := checkWritableDir(o.Dir); err != nil {
			return fmt.Errorf("--dir %s: %v", o.Dir, err)
		}
		return nil
	}},
}

// validateRun runs every rule in order; the first refusal is a usage
// error. The file-system check (--dir) comes last.
func validateRun(o *demo.Options) error {
	for _, r := range demoRules {
		if err := r.check(o); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// upToMaxDelay refuses a duration flag outside [0, maxDelayFlag].
func upToMaxDelay(name string, v time.Duration) error {
	if v < 0 || v > maxDelayFlag {
		return fmt.Errorf("--%s must be between 0 and %v, got %v", name, maxDelayFlag, v)
	}
	return nil
}

// delaysIn refuses a --data-delay value outside [0, maxDelayFlag].
func delaysIn(ds []time.Duration) error {
	for _, d := range ds {
		if d < 0 || d > maxDelayFlag {
			return fmt.Errorf("--data-delay values must be between 0 and %v, got %v", maxDelayFlag, d)
		}
	}
	return nil
}

// checkWritableDir makes dir if needed and proves it writable.
func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".kvfence-probe-")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// checkWritableFile proves that path can be written, before the run that
// will write it (a file that did not exist is not left behind).
func checkWritableFile(path string) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	if errors.Is(statErr, os.ErrNotExist) {
		return os.Remove(path)
	}
	return nil
}

// runDir makes o.Dir a new temp dir when the user named none, and returns
// a cleanup that removes it (logs and private keys) unless keep is set or
// the run failed: then its logs are the evidence, and the path is said.
func runDir(o *demo.Options, prefix string, keep bool) (func(failed bool), error) {
	if o.Dir != "" {
		return func(bool) {}, nil
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	o.Dir = dir
	return func(failed bool) {
		if keep || failed {
			if failed && !keep {
				fmt.Fprintf(os.Stderr, "kvfence: run directory kept for its logs: %s\n", dir)
			}
			return
		}
		_ = os.RemoveAll(dir)
	}, nil
}

// safeArmFailed says why a safe run broke its promise ("" if it did not).
func safeArmFailed(s *demo.Summary, crashInjected bool) string {
	var why []string
	if s.CorruptPages > 0 {
		why = append(why, fmt.Sprintf("%d corrupt pages", s.CorruptPages))
	}
	if s.Unreleased > 0 {
		why = append(why, fmt.Sprintf("%d exposures still held at the end", s.Unreleased))
	}
	// Requests whose exposure a target restart failed are the restart
	// fence's blast radius, reported as such: expected, not a broken promise.
	if lost := s.Lost - s.RestartFailed; lost > 0 && !crashInjected {
		why = append(why, fmt.Sprintf("%d failed requests (not cancelled, not handed off, not failed by a target restart)", lost))
	}
	return strings.Join(why, ", ")
}

// reportPath is where the HTML report goes: "" for none.
func reportPath(flag string, keep bool, dir string) string {
	switch {
	case flag == "none":
		return ""
	case flag != "":
		return flag
	case keep:
		return filepath.Join(dir, "report.html")
	}
	return ""
}
