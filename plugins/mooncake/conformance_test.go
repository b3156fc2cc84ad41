package mooncake_test

import (
	"os"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/mooncake"
)

// The conformance suite over the fake library with its faults on (a status
// timeout, writes that stay WAITING). The timeout is long enough that a
// loaded machine does not fail tasks on a healthy link.
//
// The endpoint is the handshake port (host:port), so --proxy auto puts the
// proxy there, but the data goes to the fake's own port: each proxy check
// must say its fault could not be applied (NOT RUN), not fail.
func TestConformanceOverFake(t *testing.T) {
	// A whole certification run over the fake library.
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	needFakes(t)
	r := nocanceltest.CertifyOverFake(t, pluginBin, fakeEnv("KVFENCE_FAKE_STATUS_TIMEOUT_MS=5000", mooncake.EnvReportAfter+"=4s"))
	for _, c := range nocanceltest.ProxyChecks {
		if why, _ := nocanceltest.SkipReason(r, c); !strings.Contains(why, "does not pass through the in-path proxy") {
			t.Errorf("%s: want NOT RUN because the data bypasses the proxy, got %q", c, why)
		}
	}
}
