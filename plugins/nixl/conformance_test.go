package nixl_test

import (
	"os"
	"testing"

	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/nixl"
)

// The conformance suite over the fake library with its faults on (writes
// that stay in progress). InDoubt is reported late enough that a loaded
// machine does not give one on a healthy link.
func TestConformanceOverFake(t *testing.T) {
	// A whole certification run over the fake library.
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	needFakes(t)
	nocanceltest.CertifyOverFake(t, pluginBin, fakeEnv(nixl.EnvReportAfter+"=4s"))
}
