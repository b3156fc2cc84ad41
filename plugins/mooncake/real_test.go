package mooncake_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/mooncake"
	"github.com/kvfence/kvfence/sdk"
)

// TestRealLibrary runs the same scenarios against a real Mooncake build
// (TCP transport, P2PHANDSHAKE, loopback), only when KVFENCE_MOONCAKE_LIB is
// set. It never counts as coverage in CI, which has no Mooncake.
func TestRealLibrary(t *testing.T) {
	lib := os.Getenv(mooncake.EnvLib)
	if lib == "" {
		t.Skip("skipped: KVFENCE_MOONCAKE_LIB is not set (no real Mooncake library to test against)")
	}
	env := []string{mooncake.EnvLib + "=" + lib, "MC_TCP_STATUS_TIMEOUT_SEC=3", "MC_LOG_LEVEL=WARNING", mooncake.EnvReportAfter + "=10s"}
	p := nocanceltest.NewPair(t, pluginBin, env, nil, nil, os.Stderr)
	b := p.Write(4096, 1<<20, 256<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	c, err := p.Wait(b.ID, 30*time.Second)
	if err != nil || c.Status != sdk.Succeeded || !p.Landed(4096, 1<<20) {
		t.Fatalf("healthy write: %+v %v", c, err)
	}
	o, err := nocanceltest.StoppedTarget(p, 2<<20, 256<<10, 64<<10, 60*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("stopped target:", o)
	if o.Broken != "" {
		t.Fatalf("broke %q: %v", o.Broken, o)
	}
}
