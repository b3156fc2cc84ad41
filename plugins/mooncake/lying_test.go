package mooncake_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/plugins/mooncake"
)

// lateLieAfter: the succeed-early variant is honest for this many batches
// of a process's life, then reports Succeeded half a second before it
// submits. More than any one process posts in the suite's short checks,
// fewer than the main pair's initiator reaches in the performance group
// (about 200 batches there, which before every Succeeded was checked read
// no target memory) and than the soak posts.
const lateLieAfter = 200

func fakeConformance(plugin string, env []string, groups ...string) conformance.Config {
	return conformance.Config{Plugin: plugin, Env: env, MaxWriteSize: 1 << 20, GuardWindow: 500 * time.Millisecond,
		GuardFloor: 500 * time.Millisecond, MaxWatch: 2 * time.Second, CompletionTimeout: 20 * time.Second,
		Repeat: 3, PerfBytes: 8 << 20, Groups: groups, FailFast: true}
}

// A plugin that reports Succeeded before its bytes land, but only late in
// a process's life, is refused for breaking the Succeeded promise: by the
// soak, and without the soak by the performance group, whose Succeeded
// completions are now checked like every other.
func TestSucceedEarlyLateIsCaught(t *testing.T) {
	// Two certification runs (one with the soak); the quick run keeps
	// TestTailJudgesFailedDefinite, a dishonest variant caught by the suite.
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	needFakes(t)
	env := fakeEnv("KVFENCE_FAKE_STATUS_TIMEOUT_MS=5000", mooncake.EnvReportAfter+"=4s", mooncake.EnvUnsafe+"=succeed-early-after:"+strconv.Itoa(lateLieAfter))
	var noSoak []string
	for _, g := range conformance.GroupNames() {
		if g != "soak" {
			noSoak = append(noSoak, g)
		}
	}
	for _, c := range []struct {
		name, where string
		groups      []string
	}{{"whole-suite", "soak/", nil}, {"without-soak", "performance/", noSoak}} {
		t.Run(c.name, func(t *testing.T) {
			r := conformance.Certify(context.Background(), fakeConformance(unsafeBin, env, c.groups...))
			if r.Passed {
				t.Fatalf("the late-lying variant passed:\n%s", r.Markdown())
			}
			if !r.BrokenPromises()[conformance.PromiseSucceeded] || !strings.HasPrefix(strings.Join(r.Failures(), "\n"), c.where) {
				t.Fatalf("the late-lying variant failed, but not for %q in %s:\n%s", conformance.PromiseSucceeded, c.where, r.Markdown())
			}
			for _, f := range r.Failures() {
				t.Log(f)
			}
		})
	}
}

// FailedDefinite promises that nothing more moves: bytes that land after
// one break that promise, however long the declared MaxTail (unbounded
// here), and the tail measured in the failed check is recorded.
func TestTailJudgesFailedDefinite(t *testing.T) {
	needFakes(t)
	env := fakeEnv(mooncake.EnvUnsafe + "=failed-is-definite")
	r := conformance.Certify(context.Background(), fakeConformance(unsafeBin, env, "tail"))
	if r.Passed || !r.BrokenPromises()[conformance.PromiseFailed] {
		t.Fatalf("bytes after FailedDefinite passed the tail group (passed %v):\n%s", r.Passed, strings.Join(r.Failures(), "\n"))
	}
	if r.WorstTail == "" {
		t.Fatalf("the failed tail check recorded no measured tail:\n%s", strings.Join(r.Failures(), "\n"))
	}
	t.Logf("worst tail %s; %s", r.WorstTail, strings.Join(r.Failures(), "; "))
}
