package nocanceltest

import (
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
)

// CertifyOverFake runs the conformance suite on a plugin binary over its
// fake library (env selects it and its faults) and checks what such a run
// can prove: every check passes, the profile is grant-only (Grant, no
// Revoke), and the only required checks left out are the link faults. The
// fakes' bytes travel between the fake libraries' own sockets, not through
// the plugin's endpoint address, so the in-path proxy cannot sit on them;
// those faults need netem. The declared tail is unbounded, so the suite
// watches MaxWatch instead.
func CertifyOverFake(t *testing.T, plugin string, env []string) {
	t.Helper()
	r := conformance.Run(t, conformance.Config{
		Plugin:            plugin,
		Proxy:             "off",
		Env:               env,
		MaxWriteSize:      1 << 20,
		GuardWindow:       500 * time.Millisecond,
		GuardFloor:        500 * time.Millisecond,
		MaxWatch:          2 * time.Second,
		CompletionTimeout: 20 * time.Second,
		Repeat:            3,
		PerfBytes:         8 << 20,
	})
	if !r.Passed {
		t.Fatalf("certification failed:\n%s", strings.Join(r.Failures(), "\n"))
	}
	if r.Profile != conformance.ProfileGrantOnly {
		t.Fatalf("want profile %q, got %q", conformance.ProfileGrantOnly, r.Profile)
	}
	for _, sk := range r.Skipped {
		if !sk.Required {
			continue
		}
		if !strings.Contains(sk.Reason, "proxy") && !strings.Contains(sk.Reason, "netem") {
			t.Errorf("required check %s did not run: %s", sk.Check, sk.Reason)
		}
		t.Logf("not certified here: %s (%s)", sk.Check, sk.Reason)
	}
}
