package nixl_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
)

// The conformance suite over the fake library with its faults on. Guard
// windows are short by configuration: the plugin's MaxTail is unbounded,
// so the suite's default (2 x MaxTail) would never end.
func TestConformanceOverFake(t *testing.T) {
	needFakes(t)
	r := conformance.Run(t, conformance.Config{
		Plugin:            pluginBin,
		Env:               fakeEnv(),
		MaxWriteSize:      1 << 20,
		GuardWindow:       500 * time.Millisecond,
		CompletionTimeout: 10 * time.Second,
		Repeat:            3,
		PerfBytes:         8 << 20,
	})
	if !r.Passed {
		t.Fatalf("certification failed:\n%s", strings.Join(r.Failures(), "\n"))
	}
	for _, g := range r.Groups {
		if g.Skipped != "" {
			t.Logf("group %s skipped by the suite: %s", g.Name, g.Skipped)
		}
	}
}
