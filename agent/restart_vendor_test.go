package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The restart fence over transports that really cannot revoke: the
// Mooncake and NIXL plugins (plugins/mooncake, plugins/nixl) loading this
// project's fake C libraries, which move real bytes over loopback TCP, map
// FAILED/WAITING (IN_PROG) to InDoubt, have no Revoke and declare a
// ~50-year tail. Plugin and library are built on first use only (go build,
// gcc), so the other agent tests do not pay for them; without gcc these
// tests skip and say why.

// vendorFake is one vendor plugin over its fake library.
type vendorFake struct {
	name, fakeSrc string
	env           func(lib string) []string // the plugin's environment
	once          sync.Once
	bin, lib      string
	skip, err     error
}

var (
	mooncakeFake = &vendorFake{name: "mooncake", fakeSrc: "fake_transfer_engine.c", env: func(lib string) []string {
		return []string{"KVFENCE_MOONCAKE_LIB=" + lib, "KVFENCE_FAKE_STATUS_TIMEOUT_MS=300", "KVFENCE_MOONCAKE_REPORT_AFTER=1s"}
	}}
	nixlFake = &vendorFake{name: "nixl", fakeSrc: "fake_nixl_capi.c", env: func(lib string) []string {
		return []string{"KVFENCE_NIXL_LIB=" + lib, "UCX_TLS=tcp", "KVFENCE_NIXL_REPORT_AFTER=1s"}
	}}
)

// build builds the plugin and the fake library into testDir, once.
func (v *vendorFake) build(t *testing.T) {
	t.Helper()
	v.once.Do(func() {
		cc, err := exec.LookPath("gcc")
		if err != nil {
			v.skip = fmt.Errorf("skipped: gcc not found, cannot build the fake %s library (apt-get install gcc)", v.name)
			return
		}
		v.lib = filepath.Join(testDir, "libfake_"+v.name+".so")
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread", "-o", v.lib,
			"-I../plugins/kit/nocancel/testdata", "../plugins/"+v.name+"/testdata/"+v.fakeSrc,
			"../plugins/kit/nocancel/testdata/fakewire.c").CombinedOutput(); err != nil {
			v.err = fmt.Errorf("gcc: %v\n%s", err, out)
			return
		}
		v.bin = filepath.Join(testDir, "kvfence-plugin-"+v.name)
		if out, err := exec.Command("go", "build", "-o", v.bin, "../plugins/"+v.name+"/cmd/kvfence-plugin-"+v.name).CombinedOutput(); err != nil {
			v.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if v.skip != nil {
		t.Skip(v.skip)
	}
	if v.err != nil {
		t.Fatal(v.err)
	}
}

// backend: target instances of the plugin over the fake, dying slowly,
// and a writer data path of the same plugin.
func (v *vendorFake) backend(t *testing.T, dieAfter time.Duration) restartBackend {
	v.build(t)
	opts := sdk.OpenOptions{Env: v.env(v.lib), StartTimeout: 30 * time.Second}
	return restartBackend{name: v.name + "-fake",
		target: func() (TargetProcess, error) {
			p, err := sdk.Open(v.bin, opts)
			if err != nil {
				return nil, err
			}
			return slowDeath{p, dieAfter}, nil
		},
		writer: func(t *testing.T) sdk.Transport { return sdktest.Subprocess(t, v.bin, opts).Transport() },
	}
}

// TestRestartFenceVendorFakes is TestRestartFenceEndsHoldOfKilledUnboundedWriter
// over the Mooncake and NIXL plugins: rank 1 declares an unbounded tail
// and is killed with SIGKILL while its writes keep arriving at decode's
// target instance; A's hold ends fenced (the plugins' tail is unbounded,
// so no timeout could end it), with no write landing in the freed slot.
func TestRestartFenceVendorFakes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	// Four restart-fence runs over two vendor fakes (~40 s under -race);
	// make demo-smoke runs the Mooncake one with a killed rank.
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	for _, v := range []*vendorFake{mooncakeFake, nixlFake} {
		t.Run(v.name, func(t *testing.T) {
			be := v.backend(t, 200*time.Millisecond)
			for _, targets := range []int{1, 2} {
				t.Run(fmt.Sprintf("targets=%d", targets), func(t *testing.T) {
					checkRestartFenced(t, targets, runRestartScenario(t, targets, be))
				})
			}
		})
	}
}
