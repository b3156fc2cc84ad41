package agent

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The restart fence over a transport that really cannot revoke: the
// Mooncake plugin (plugins/mooncake) loading this project's fake Transfer
// Engine library, which moves real bytes over loopback TCP, maps FAILED
// and WAITING to InDoubt, has no Revoke and declares a ~50-year tail. Both
// are built on first use only (go build, gcc), so the other agent tests do
// not pay for them; without gcc these tests skip and say why.

var mooncakeFake struct {
	once      sync.Once
	bin, lib  string
	skip, err error
}

// buildMooncakeFake builds the plugin and the fake library into testDir.
func buildMooncakeFake(t *testing.T) (bin, lib string) {
	t.Helper()
	m := &mooncakeFake
	m.once.Do(func() {
		cc, err := exec.LookPath("gcc")
		if err != nil {
			m.skip = fmt.Errorf("skipped: gcc not found, cannot build the fake Mooncake library (apt-get install gcc)")
			return
		}
		m.lib = filepath.Join(testDir, "libfake_transfer_engine.so")
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread", "-o", m.lib,
			"-I../plugins/internal/nocancel/testdata", "../plugins/mooncake/testdata/fake_transfer_engine.c",
			"../plugins/internal/nocancel/testdata/fakewire.c").CombinedOutput(); err != nil {
			m.err = fmt.Errorf("gcc: %v\n%s", err, out)
			return
		}
		m.bin = filepath.Join(testDir, "kvfence-plugin-mooncake")
		if out, err := exec.Command("go", "build", "-o", m.bin, "../plugins/mooncake/cmd/kvfence-plugin-mooncake").CombinedOutput(); err != nil {
			m.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if m.skip != nil {
		t.Skip(m.skip)
	}
	if m.err != nil {
		t.Fatal(m.err)
	}
	return m.bin, m.lib
}

// mooncakeOverFake is the Mooncake plugin over the fake library, with the
// fake's status timeout and the plugin's WAITING report short (as the
// plugin's own fault tests run it).
func mooncakeOverFake(t *testing.T, dieAfter time.Duration) restartBackend {
	bin, lib := buildMooncakeFake(t)
	opts := sdk.OpenOptions{Env: []string{"KVFENCE_MOONCAKE_LIB=" + lib, "KVFENCE_FAKE_STATUS_TIMEOUT_MS=300",
		"KVFENCE_MOONCAKE_REPORT_AFTER=1s"}, StartTimeout: 30 * time.Second}
	return restartBackend{name: "mooncake-fake",
		target: func() (TargetProcess, error) {
			p, err := sdk.Open(bin, opts)
			if err != nil {
				return nil, err
			}
			return slowDeath{p, dieAfter}, nil
		},
		writer: func(t *testing.T) sdk.Transport { return sdktest.Subprocess(t, bin, opts).Transport() },
	}
}

// TestRestartFenceMooncakeFake is TestRestartFenceEndsHoldOfKilledUnboundedWriter
// over the Mooncake plugin: rank 1 declares an unbounded tail and is
// killed with SIGKILL while its writes keep arriving at decode's target
// instance; A's hold ends fenced (the plugin's tail is unbounded, so no
// timeout could end it), with no write landing in the freed slot.
func TestRestartFenceMooncakeFake(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	be := mooncakeOverFake(t, 200*time.Millisecond)
	for _, targets := range []int{1, 2} {
		t.Run(fmt.Sprintf("targets=%d", targets), func(t *testing.T) {
			checkRestartFenced(t, targets, runRestartScenario(t, targets, be))
		})
	}
}
