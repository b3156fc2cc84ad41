package mooncake_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
)

// The conformance suite over the fake library with its faults on. Guard
// windows are short by configuration: the plugin's MaxTail is unbounded,
// so the suite watches MaxWatch instead (profile grant-only: no Revoke).
func TestConformanceOverFake(t *testing.T) {
	needFakes(t)
	r := conformance.Run(t, conformance.Config{
		Plugin:            pluginBin,
		Env:               fakeEnv(),
		MaxWriteSize:      1 << 20,
		GuardWindow:       500 * time.Millisecond,
		GuardFloor:        500 * time.Millisecond,
		MaxWatch:          2 * time.Second, // the declared tail is unbounded: watch this long
		CompletionTimeout: 10 * time.Second,
		Repeat:            3,
		PerfBytes:         8 << 20,
	})
	if !r.Passed {
		t.Fatalf("certification failed:\n%s", strings.Join(r.Failures(), "\n"))
	}
	if r.Partial || r.Profile != conformance.ProfileGrantOnly {
		t.Fatalf("want a complete grant-only run, got profile %q partial=%v: %v", r.Profile, r.Partial, r.PartialReasons)
	}
	for _, g := range r.Groups {
		if g.Skipped != "" {
			t.Logf("group %s skipped by the suite: %s", g.Name, g.Skipped)
		}
	}
}
