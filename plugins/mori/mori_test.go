package mori_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/mori"
	"github.com/kvfence/kvfence/sdk"
)

func TestHandshakeRefusals(t *testing.T) {
	needFakes(t)
	cases := []struct{ name, shim, want string }{
		{"shim missing", "", "KVFENCE_MORI_SHIM is not set"},
		{"unsupported shim interface", oldShim, "unsupported version: shim interface 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(pluginBin)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/nonexistent"}
			if c.shim != "" {
				cmd.Env = append(cmd.Env, mori.EnvShim+"="+c.shim)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			line := strings.TrimRight(stderr.String(), "\n")
			if err == nil || strings.Contains(line, "\n") || !strings.Contains(line, c.want) || !strings.Contains(line, mori.EnvShim) {
				t.Fatalf("exit %v, stderr %q: want one line with %q naming %s", err, stderr.String(), c.want, mori.EnvShim)
			}
			t.Log(line)
		})
	}
}

func fakeEnv(extra ...string) []string {
	return append([]string{mori.EnvShim + "=" + fakeShim, "KVFENCE_FAKE_STATUS_TIMEOUT_MS=300", "KVFENCE_FAKE_WAIT_FOREVER_BYTES=4194304", mori.EnvReportAfter + "=1s"}, extra...)
}

func newPair(t *testing.T, bin string, env []string) *nocanceltest.Pair {
	needFakes(t)
	if testing.Verbose() {
		return nocanceltest.NewPair(t, bin, env, nil, nil, os.Stderr)
	}
	return nocanceltest.NewPair(t, bin, env, nil, nil, nil)
}

// The Go side against the fake shim: a healthy write, an error while the
// bytes still land (InDoubt), and the dishonest variant caught.
func TestAgainstFakeShim(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv())
	b := p.Write(4096, 1<<20, 128<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if c, err := p.Wait(b.ID, 10*time.Second); err != nil || c.Status != sdk.Succeeded || !p.Landed(4096, 1<<20) {
		t.Fatalf("healthy write: %+v %v", c, err)
	}
	o, err := nocanceltest.StoppedTarget(p, 2<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("honest:", o)
	if o.Broken != "" || o.Completion.Status != sdk.InDoubt || !o.LateLanded {
		t.Fatalf("honest plugin: %v", o)
	}
	u := newPair(t, unsafeBin, fakeEnv("KVFENCE_MORI_UNSAFE=failed-is-definite"))
	o, err = nocanceltest.StoppedTarget(u, 2<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("dishonest:", o)
	if o.Completion.Status != sdk.FailedDefinite || o.Broken != nocanceltest.PromiseFailed {
		t.Fatalf("the failed-is-definite variant was not caught: %v", o)
	}
}

func TestStatusMapping(t *testing.T) {
	for code, want := range map[int]string{0: "COMPLETED", 1: "WAITING", 2: "PENDING", 11: "FAILED", 13: "FAILED", 15: "FAILED", 7: "UNKNOWN"} {
		if got := mori.StateOf(code).String(); got != want {
			t.Errorf("StateOf(%d) = %s, want %s", code, got, want)
		}
	}
}

// TestRealShim runs against a shim built over real MORI (make mori-shim),
// only when KVFENCE_MORI_SHIM is set. It has never run: no MORI here.
func TestRealShim(t *testing.T) {
	shim := os.Getenv(mori.EnvShim)
	if shim == "" {
		t.Skip("skipped: KVFENCE_MORI_SHIM is not set (no shim built over real MORI-IO; it has never run against real MORI)")
	}
	p := nocanceltest.NewPair(t, pluginBin, []string{mori.EnvShim + "=" + shim, mori.EnvReportAfter + "=10s"}, nil, nil, os.Stderr)
	o, err := nocanceltest.StoppedTarget(p, 2<<20, 256<<10, 64<<10, 60*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("stopped target:", o)
	if o.Broken != "" {
		t.Fatalf("broke %q: %v", o.Broken, o)
	}
}
