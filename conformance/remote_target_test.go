package conformance_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
)

// remoteTargetConfig starts `kvfence conformance target`'s server for
// plugin on loopback (as an operator would on the second machine) and
// returns a suite configuration pointed at it. No root.
func remoteTargetConfig(t *testing.T, plugin string, env ...string) conformance.Config {
	t.Helper()
	secret := []byte("0123456789abcdef0123456789abcdef")
	ready, done := make(chan string, 1), make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		done <- conformance.ServeTarget(ctx, conformance.TargetConfig{Plugin: plugin, Listen: "127.0.0.1:0", DataAddr: "127.0.0.1",
			Secret: secret, Size: 1 << 20, Ready: func(a string) { ready <- a }})
	}()
	t.Cleanup(func() { cancel(); <-done })
	cfg := testConfig(plugin, env...)
	select {
	case cfg.RemoteTarget = <-ready:
	case err := <-done:
		t.Fatalf("target host did not start: %v", err)
	}
	cfg.RemoteSecret = secret
	// Every call and memory read crosses the control channel: on a loaded
	// 2-core machine testConfig's 5 s for a whole-pool batch ran out once.
	cfg.CompletionTimeout = 30 * time.Second
	cfg.Groups = []string{"handshake", "memory-registration", "write-correctness", "failure-honesty", "remote-refusals"}
	return cfg
}

// A target host on another machine (Config.RemoteTarget; here loopback):
// the groups run against the target processes it opens and the memory it
// owns, the process faults (SIGSTOP, SIGKILL of the target) are delivered
// there, and the link-fault checks, which need the namespaces, are NOT RUN
// with their reason — a partial run, never a certificate.
func TestRemoteTargetHost(t *testing.T) {
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	r := conformance.Certify(context.Background(), remoteTargetConfig(t, pluginBin))
	if r.Setup != "" || !r.Passed {
		t.Fatalf("the reference plugin against a remote target host: %s\n%s", r.Setup, strings.Join(r.Failures(), "\n"))
	}
	if r.Certified || !r.Partial {
		t.Errorf("certified %v, partial %v: the link-fault checks did not run", r.Certified, r.Partial)
	}
	for _, check := range []string{"target-stopped", "target-killed", "target-memory-deregistered"} {
		if got := outcome(r, "failure-honesty", check); got != conformance.Pass {
			t.Errorf("failure-honesty/%s: %q, want pass (its fault is delivered on the target host)", check, got)
		}
	}
	if got := outcome(r, "failure-honesty", "link-stalled"); got != conformance.Skip {
		t.Errorf("failure-honesty/link-stalled: %q, want NOT RUN (no kernel faults on a real link)", got)
	}
	if r.Link.Kind != "two-host" || r.Link.Hosts == nil || r.Link.Hosts.Target.Hostname == "" {
		t.Errorf("link %+v does not name the target host", r.Link)
	}
}

// Against a remote target host, a Succeeded before the bytes land is
// caught by that host's read of its memory.
func TestRemoteTargetHostCatchesSucceedBeforeAck(t *testing.T) {
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	cfg := remoteTargetConfig(t, unsafeBin, "KVFENCE_TCP_UNSAFE=succeed-before-ack")
	cfg.FailFast = true
	r := conformance.Certify(context.Background(), cfg)
	if r.Setup != "" || r.Passed || !r.BrokenPromises()[conformance.PromiseSucceeded] {
		t.Fatalf("succeed-before-ack against a remote target host: setup %q, failures:\n%s", r.Setup, strings.Join(r.Failures(), "\n"))
	}
}

// outcome is check's outcome in group ("" if it did not run).
func outcome(r *conformance.Report, group, check string) conformance.Outcome {
	for _, g := range r.Groups {
		for _, res := range g.Results {
			if g.Name == group && res.Check == check {
				return res.Outcome
			}
		}
	}
	return ""
}
