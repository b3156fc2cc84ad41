package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/demo"
)

// agentExe is the kvfence binary the tests run as a command and as the
// demo's rank processes (demo.Options.Exe): the test binary itself is not
// one.
var agentExe string

// TestMain builds the kvfence binary once: the demo's rank processes and
// their TCP plugin processes are that binary re-executed.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-cmd-test-")
	if err != nil {
		panic(err)
	}
	agentExe = filepath.Join(dir, "kvfence")
	out, err := exec.Command("go", "build", "-o", agentExe, ".").CombinedOutput()
	if err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	unsafeOnce sync.Once
	unsafeExe  string
	unsafeErr  error
)

// unsafeBinary builds kvfence with -tags kvfenceunsafe (once): the only
// build whose agents can run a known-unsafe core.
func unsafeBinary(t *testing.T) string {
	t.Helper()
	unsafeOnce.Do(func() {
		unsafeExe = filepath.Join(filepath.Dir(agentExe), "kvfence-unsafe")
		if out, err := exec.Command("go", "build", "-tags", "kvfenceunsafe", "-o", unsafeExe, ".").CombinedOutput(); err != nil {
			unsafeErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if unsafeErr != nil {
		t.Fatal(unsafeErr)
	}
	return unsafeExe
}

func smallDemo(t *testing.T, unsafe string, fence bool, seed uint64) *demo.Summary {
	t.Helper()
	exe := agentExe
	if unsafe != "" {
		exe = unsafeBinary(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := demo.Run(ctx, demo.Options{Requests: 96, Concurrency: 32, MinPages: 4, MaxPages: 12, AbortShare: 0.4,
		PageEvery: 5 * time.Millisecond, DecodeFor: 500 * time.Millisecond,
		Delays: []time.Duration{400 * time.Millisecond, time.Millisecond}, Unsafe: unsafe, Fence: fence, TLS: true,
		Dir: t.TempDir(), Seed: seed, Exe: exe})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *s)
	return s
}

// The promise: aborts mid-transfer with writes really arriving late, and no
// page ever holds another request's bytes.
func TestDemoSafeHasNoCorruptPages(t *testing.T) {
	s := smallDemo(t, "", true, 3)
	if s.Aborts == 0 {
		t.Fatalf("no aborts: the run proves nothing")
	}
	if s.CorruptPages != 0 {
		t.Fatalf("corrupt_pages = %d, want 0", s.CorruptPages)
	}
	if s.PagesVerified == 0 || s.Handoffs == 0 {
		t.Fatalf("nothing verified: %+v", *s)
	}
	if s.Unreleased != 0 {
		t.Fatalf("%d exposures still held at the end", s.Unreleased)
	}
	if s.ReleasedDrained+s.ReleasedFenced+s.ReleasedTimeout != s.Aborts {
		t.Fatalf("aborted exposures %d, released by drained/fenced/timeout %d", s.Aborts, s.ReleasedDrained+s.ReleasedFenced+s.ReleasedTimeout)
	}
}

// A test that cannot fail proves nothing: the known-unsafe release-on-abort
// core must corrupt pages under the same workload.
func TestDemoUnsafeReleaseOnAbortCorrupts(t *testing.T) {
	// Every variant the demo accepts (demoShowable) must show itself.
	// Whether a late write lands on a reused page depends on timing, so
	// each variant gets three seeds; each run is seconds.
	for _, v := range demoShowable {
		t.Run(v.Name(), func(t *testing.T) {
			for seed := uint64(1); seed <= 3; seed++ {
				if s := smallDemo(t, v.Name(), false, seed); s.CorruptPages > 0 {
					return
				}
			}
			t.Fatalf("%s gave corrupt_pages = 0 in three runs; the demo cannot see the hazard", v.Name())
		})
	}
}

// A prefill rank is killed with kill -9 mid-run (its plugin process dies
// with it). Decode declares it dead and aborts what it was writing; a dead
// rank never drains, so those holds end by fence (or timeout), nothing is
// left held, and no page ever holds another request's bytes.
func TestDemoPrefillRankCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := demo.Run(ctx, demo.Options{Requests: 64, Concurrency: 32, MinPages: 4, MaxPages: 12, AbortShare: 0,
		PageEvery: 5 * time.Millisecond, DecodeFor: 300 * time.Millisecond,
		Delays: []time.Duration{400 * time.Millisecond, time.Millisecond}, Fence: true, TLS: true,
		Dir: t.TempDir(), Seed: 5, KillPrefillAfter: 300 * time.Millisecond, Exe: agentExe})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *s)
	if s.Aborts == 0 {
		t.Fatalf("no request was cut by the crash: the run proves nothing")
	}
	if s.CorruptPages != 0 {
		t.Fatalf("corrupt_pages = %d after a rank crash, want 0", s.CorruptPages)
	}
	if s.ReleasedFenced+s.ReleasedTimeout == 0 {
		t.Fatalf("no hold ended by fence or timeout: a dead rank cannot have drained them all: %+v", *s)
	}
	if s.Unreleased != 0 {
		t.Fatalf("%d exposures still held at the end", s.Unreleased)
	}
	if s.ReleasedDrained+s.ReleasedFenced+s.ReleasedTimeout != s.Aborts {
		t.Fatalf("aborted exposures %d, released by drained/fenced/timeout %d", s.Aborts, s.ReleasedDrained+s.ReleasedFenced+s.ReleasedTimeout)
	}
}
