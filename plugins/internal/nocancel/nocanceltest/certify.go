package nocanceltest

import (
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
)

// CertifyOverFake runs the conformance suite on a plugin binary over its
// fake library (env selects it and its faults) and checks what such a run
// can prove: every check that runs passes, the profile is grant-only
// (Grant, no Revoke), and the only required checks left out are the link
// faults. The fakes' bytes travel between the fake libraries' own sockets,
// not through the plugin's endpoint address (as Mooncake's data port is
// not its handshake port), so the in-path proxy the default --proxy auto
// puts on that address carries none of them: each proxy check must be
// reported NOT RUN with that reason (never failed, never passed), which
// leaves the run partial and without a certificate; those faults need
// netem. The declared tail is unbounded, so the suite watches MaxWatch
// instead.
func CertifyOverFake(t *testing.T, plugin string, env []string) {
	t.Helper()
	r := conformance.Run(t, conformance.Config{
		Plugin:            plugin,
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
	if !r.Partial || r.Certified {
		t.Fatalf("a plugin whose data bypasses the proxy: partial %v certified %v, want a partial run without a certificate", r.Partial, r.Certified)
	}
	bypassed := map[string]bool{}
	for _, sk := range r.Skipped {
		if !sk.Required {
			continue
		}
		switch {
		case strings.Contains(sk.Reason, "does not pass through the in-path proxy"):
			bypassed[sk.Check] = true
		case !strings.Contains(sk.Reason, "netem"):
			t.Errorf("required check %s did not run: %s", sk.Check, sk.Reason)
		}
		t.Logf("not certified here: %s (%s)", sk.Check, sk.Reason)
	}
	for _, c := range ProxyChecks {
		if !bypassed[c] {
			t.Errorf("%s: want a required skip saying the data bypasses the proxy; skipped: %v", c, r.Skipped)
		}
	}
}

// ProxyChecks are the checks whose fault is the in-path proxy's.
var ProxyChecks = []string{
	"failure-honesty/link-delayed", "failure-honesty/link-stalled",
	"failure-honesty/link-stalled-quiesce-at-once", "failure-honesty/link-lossy",
	"failure-honesty/link-reset", "tail/link-restored-late",
}
