package mooncake_test

import (
	"testing"

	"github.com/kvfence/kvfence/plugins/internal/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/mooncake"
)

// The conformance suite over the fake library with its faults on (a status
// timeout, writes that stay WAITING). The timeout is long enough that a
// loaded machine does not fail tasks on a healthy link.
func TestConformanceOverFake(t *testing.T) {
	needFakes(t)
	nocanceltest.CertifyOverFake(t, pluginBin, fakeEnv("KVFENCE_FAKE_STATUS_TIMEOUT_MS=5000", mooncake.EnvReportAfter+"=4s"))
}
