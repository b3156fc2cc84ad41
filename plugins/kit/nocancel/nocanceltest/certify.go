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
// faults, so the run is partial and has no certificate. The fakes' bytes
// travel between the fake libraries' own sockets, not through the plugin's
// endpoint address, so the in-path proxy cannot fault them: either the
// endpoint is no host:port and no proxy is inserted (NIXL), or the default
// --proxy auto inserts one that carries none of the data (Mooncake: its
// endpoint is the handshake port); each proxy check must then be reported
// NOT RUN, never failed and never passed, and the netem checks, which such
// a proxy does not stand in for, stay required. Those faults need netem. The
// declared tail is unbounded, so the suite watches MaxWatch instead. It
// returns the report for plugin-specific checks.
func CertifyOverFake(t *testing.T, plugin string, env []string) *conformance.Report {
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
		t.Fatalf("partial %v certified %v: the link faults cannot reach the fakes' data, want a partial run without a certificate", r.Partial, r.Certified)
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
	for _, c := range ProxyChecks {
		if why, req := SkipReason(r, c); !req || !strings.Contains(why, "proxy") {
			t.Errorf("%s: want a required skip naming the proxy, got %q (required %v)", c, why, req)
		}
	}
	// A proxy that carried none of the data waives nothing: the netem
	// checks stay required (before, --proxy auto left them out, so the
	// run showed 6 required checks not run instead of 8).
	for _, c := range NetemChecks {
		if why, req := SkipReason(r, c); !req || !strings.Contains(why, "netem") {
			t.Errorf("%s: want a required skip naming netem, got %q (required %v)", c, why, req)
		}
	}
	return r
}

// ProxyChecks are the checks whose fault is the in-path proxy's.
var ProxyChecks = []string{
	"failure-honesty/link-delayed", "failure-honesty/link-stalled",
	"failure-honesty/link-stalled-quiesce-at-once", "failure-honesty/link-lossy",
	"failure-honesty/link-reset", "tail/link-restored-late",
}

// NetemChecks are the checks whose fault is tc netem on the data link.
var NetemChecks = []string{"failure-honesty/netem-delay-loss", "tail/netem-restored-late"}

// SkipReason is why check (group/check) did not run and whether the
// profile required it ("" if it ran).
func SkipReason(r *conformance.Report, check string) (string, bool) {
	for _, sk := range r.Skipped {
		if sk.Check == check {
			return sk.Reason, sk.Required
		}
	}
	return "", false
}
