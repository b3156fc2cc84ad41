package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// twoHostConfig is a two-host run of plugin with the short TCP settings of
// the Makefile's conformance targets; it skips (saying why) without root or
// network namespaces.
func twoHostConfig(t *testing.T, plugin string, env ...string) conformance.TwoHostConfig {
	t.Helper()
	if os.Getenv("KVFENCE_TWOHOST") == "" {
		t.Skip("two-host certification is the root-only CI step conformance-two-host (make ci-root sets KVFENCE_TWOHOST=1)")
	}
	if os.Geteuid() != 0 {
		t.Skip("two-host certification needs root (network namespaces); run with make ci-root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("two-host certification needs iproute2 (ip, tc)")
	}
	ns := "kvfc-probe-" + strings.ReplaceAll(t.Name(), "/", "-")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace here: %v: %s", err, out)
	}
	_ = exec.Command("ip", "netns", "del", ns).Run()
	kvfenceOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvfence-twohost-cli")
		if err != nil {
			kvfenceErr = err
			return
		}
		kvfenceBin, kvfenceErr = sdktest.BuildPlugin(dir, "github.com/kvfence/kvfence/cmd/kvfence")
	})
	if kvfenceErr != nil {
		t.Fatalf("build kvfence: %v", kvfenceErr)
	}
	kvfence := kvfenceBin
	return conformance.TwoHostConfig{
		Plugin:            plugin,
		Env:               append([]string{"KVFENCE_TCP_WRITE_TTL=2s", "KVFENCE_TCP_ACK_TIMEOUT=1s"}, env...),
		TargetCommand:     []string{kvfence, "conformance", "target"},
		GuardFloor:        time.Second,
		CompletionTimeout: 20 * time.Second,
		Log:               testWriter{t},
	}
}

// The kvfence binary the target host runs, built once per test binary (it
// is left in the temporary directory, as the plugins' is by TestMain).
var (
	kvfenceOnce sync.Once
	kvfenceBin  string
	kvfenceErr  error
)

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// The reference TCP plugin across two hosts (network namespaces, the target
// in its own `kvfence conformance target` process): every check that can
// run passes; a check NOT RUN (netem without sch_netem, reject without
// nftables) says why and withholds the certificate.
func TestTwoHostTCPPlugin(t *testing.T) {
	r := conformance.CertifyTwoHost(context.Background(), twoHostConfig(t, pluginBin))
	t.Log(conformance.TwoHostMarkdown(r))
	if r.Error != "" || !r.Passed {
		t.Fatalf("the reference plugin did not pass two-host certification: %s", r.Error)
	}
	skipped := 0
	for _, c := range r.Checks {
		if c.Status == "skip" {
			skipped++
			if c.Reason == "" {
				t.Errorf("%s NOT RUN without a reason", c.Name)
			}
			if c.Name != "netem-delay-loss" && c.Name != "link-rejected" {
				t.Errorf("%s NOT RUN on a link that has its fault: %s", c.Name, c.Reason)
			}
		}
	}
	if r.Certified != (skipped == 0) {
		t.Errorf("certified=%v with %d check(s) NOT RUN: a skipped check is never a pass", r.Certified, skipped)
	}
	if len(r.Checks) != 6 {
		t.Errorf("%d checks ran, want 6", len(r.Checks))
	}
	for _, h := range []struct {
		host conformance.HostInfo
		addr string
	}{{r.Initiator, "10.213.213.1"}, {r.Target, "10.213.213.2"}} {
		if h.host.Netns == "" || !strings.Contains(h.host.String(), h.addr) {
			t.Errorf("the report does not name the host with %s and its NIC: %s", h.addr, h.host)
		}
	}
}

// Known-broken variants of the TCP plugin are caught across two hosts under
// a kernel fault on the link between them (not only on a healthy link).
func TestTwoHostCatchesBrokenVariants(t *testing.T) {
	for _, v := range []struct{ name, promise string }{
		// FailedDefinite while the write keeps retrying: the dropped
		// link's bytes land once it comes back.
		{"failed-on-timeout", conformance.PromiseFailed},
		// Succeeded before the target acknowledged.
		{"succeed-before-ack", conformance.PromiseSucceeded},
	} {
		t.Run(v.name, func(t *testing.T) {
			r := conformance.CertifyTwoHost(context.Background(), twoHostConfig(t, unsafeBin, "KVFENCE_TCP_UNSAFE="+v.name))
			if r.Error != "" {
				t.Fatal(r.Error)
			}
			if r.Passed || r.Certified {
				t.Fatalf("variant %s passed two-host certification:\n%s", v.name, conformance.TwoHostMarkdown(r))
			}
			caught := false
			for _, c := range r.Checks {
				if c.Status == "fail" && c.Name != "healthy-write" && c.Promise == v.promise {
					t.Logf("%s caught under a link fault by %s: %s", v.name, c.Name, c.Reason)
					caught = true
				}
			}
			if !caught {
				t.Fatalf("%s was not caught under a link fault breaking %q:\n%s", v.name, v.promise, conformance.TwoHostMarkdown(r))
			}
		})
	}
}
