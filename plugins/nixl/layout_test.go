package nixl_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/nixl"
	"github.com/kvfence/kvfence/sdk"
)

// Both C API layouts drive a healthy write to Succeeded. The versioned
// fake reads its configuration in the 0.1 layout (it refuses thread sync
// other than STRICT, which is what the 8770b655 layout reads as there) and
// aborts on a plain free() of a buffer it returned.
func TestCAPILayouts(t *testing.T) {
	for _, c := range []struct{ name, lib, version string }{
		{"8770b655", fakeLib, "unversioned (NIXL 8770b655 layout)"},
		{"0.1", v01Lib, "c-api 0.1.0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := append(fakeEnv(), nixl.EnvLib+"="+c.lib)
			p := newPair(t, pluginBin, env)
			b := p.Write(4096, 1<<20, 256<<10)
			if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			if got, err := p.Wait(b.ID, 20*time.Second); err != nil || got.Status != sdk.Succeeded || !p.Landed(4096, 1<<20) {
				t.Fatalf("completion %+v err %v", got, err)
			}
			info, err := p.Ini.Transport().Info(context.Background())
			if err != nil || !strings.Contains(info.Version, c.version) {
				t.Fatalf("Info.Version %q (%v), want it to name %q", info.Version, err, c.version)
			}
		})
	}
}

// A C API version the plugin has not read is refused before the handshake
// with one classified line naming it.
func TestUnknownCAPIVersionRefused(t *testing.T) {
	needFakes(t)
	cmd := exec.Command(pluginBin)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "UCX_TLS=tcp", nixl.EnvLib + "=" + v02Lib}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	line := strings.TrimRight(stderr.String(), "\n")
	if err == nil || strings.Contains(line, "\n") || !strings.HasPrefix(line, "failed-precondition:") ||
		!strings.Contains(line, "unsupported version") || !strings.Contains(line, "0.2.0") || !strings.Contains(line, nixl.EnvLib) {
		t.Fatalf("exit %v, stderr %q: want one failed-precondition line refusing C API 0.2.0", err, stderr.String())
	}
	t.Log(line)
}

// syncBuffer collects a plugin's stderr from the host's copying goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// post_xfer_req that fails after the transfer started: Post still accepts
// the batch (the C API's BACKEND does not say nothing left), the plugin
// logs the failed post, and the batch is not Succeeded though the status
// later reads SUCCESS.
func TestPostResultLogged(t *testing.T) {
	needFakes(t)
	var log syncBuffer
	p := nocanceltest.NewPair(t, pluginBin, fakeEnv(), []string{"KVFENCE_FAKE_POST_FAIL=1"}, nil, &log)
	b := p.Write(4096, 256<<10, 64<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	c, err := p.Wait(b.ID, 20*time.Second)
	if err != nil || c.Status != sdk.InDoubt {
		t.Fatalf("completion %+v err %v: a failed post's request was trusted", c, err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if s := log.String(); strings.Contains(s, "post_xfer_req failed") && strings.Contains(s, "ERROR_BACKEND (-2)") {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no log line for the failed post; plugin stderr:\n%s", log.String())
		}
	}
}
