package nixl_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/nixl"
	"github.com/kvfence/kvfence/sdk"
)

// Without a usable library, or with a UCX_TLS that allows shared-memory
// transports, the plugin exits before the handshake with one classified
// line naming what to set.
func TestHandshakeRefusals(t *testing.T) {
	needFakes(t)
	cases := []struct{ name, lib, tls, want string }{
		{"library missing", "", "tcp", "KVFENCE_NIXL_LIB is not set"},
		{"required symbol missing", brokeLib, "tcp", "lacks the required symbol nixl_capi_get_xfer_status"},
		{"UCX_TLS unset", fakeLib, "", "UCX_TLS is not set"},
		{"shared-memory transport", fakeLib, "tcp,cma", "allows cma"},
		{"exclusion list", fakeLib, "^ib", "excludes transports"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(pluginBin)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/nonexistent", "UCX_TLS=" + c.tls}
			if c.lib != "" {
				cmd.Env = append(cmd.Env, nixl.EnvLib+"="+c.lib)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			line := strings.TrimRight(stderr.String(), "\n")
			if err == nil || strings.Contains(line, "\n") || !strings.Contains(line, c.want) || !strings.HasPrefix(line, "failed-precondition:") {
				t.Fatalf("exit %v, stderr %q: want one failed-precondition line with %q", err, stderr.String(), c.want)
			}
			t.Log(line)
		})
	}
}

func TestUCXTransports(t *testing.T) {
	for _, ok := range []string{"tcp", "rc,tcp", "rc_x,ud_x", "dc_mlx5,tcp"} {
		if err := nixl.CheckUCXTransports(ok); err != nil {
			t.Errorf("UCX_TLS=%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "all", "sm", "tcp,shm", "posix", "sysv", "cma", "xpmem", "knem", "cuda_ipc,tcp", "^cma", "rc,TCP,Cma"} {
		if err := nixl.CheckUCXTransports(bad); !errdefs.Is(err, errdefs.FailedPrecondition) {
			t.Errorf("UCX_TLS=%q accepted: %v", bad, err)
		}
	}
}

// Under conformance --netns each process gets its namespace's address in
// KVFENCE_TCP_LISTEN: the key directory must listen there, not on
// 127.0.0.1 (unreachable from the other namespace).
func TestDirListenFollowsNamespaceAddress(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, ""},
		{map[string]string{"KVFENCE_TCP_LISTEN": "10.213.213.2:0"}, "10.213.213.2:0"},
		{map[string]string{"KVFENCE_TCP_LISTEN": "10.213.213.2:0", nixl.EnvDirListen: "127.0.0.1:7000"}, "127.0.0.1:7000"},
	} {
		cfg, err := nixl.ConfigFromEnv(env(c.env))
		if err != nil || cfg.DirListen != c.want {
			t.Errorf("%v: dir %q (%v), want %q", c.env, cfg.DirListen, err, c.want)
		}
	}
}

// fakeEnv: the fake with no status timeout (NIXL has none); the plugin
// reports a request still IN_PROG after 1 s. The fake aborts if two threads
// enter its agent at once (the real agent's default thread sync is NONE),
// so every test over it also checks that the plugin serialises its calls.
func fakeEnv(extra ...string) []string {
	return append([]string{nixl.EnvLib + "=" + fakeLib, "UCX_TLS=tcp", "KVFENCE_FAKE_WAIT_FOREVER_BYTES=1073741824",
		nixl.EnvReportAfter + "=1s", "KVFENCE_FAKE_ONE_CALLER=1"}, extra...)
}

// Concurrent posters while the poller runs: the agent is entered by one
// thread at a time (the fake aborts otherwise), and every batch succeeds.
func TestCallsAreSerialised(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv())
	const posters, each = 8, 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	posted := map[sdk.BatchID]bool{}
	for g := 0; g < posters; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				b := p.Write(uint64(g*each+i)*8192, 4096, 4096)
				if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				posted[b.ID] = true
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	for n := 0; n < posters*each; n++ {
		select {
		case c := <-p.Ini.Transport().Completions():
			mu.Lock()
			ok := posted[c.Batch]
			delete(posted, c.Batch)
			mu.Unlock()
			if !ok || c.Status != sdk.Succeeded {
				t.Fatalf("completion %+v (posted: %v)", c, ok)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d completions, then none for 20s (did the plugin die?)", n, posters*each)
		}
	}
}

// The progress delay: NIXL's default 0 makes its progress thread spin, so
// 0 is refused and the default is 1 ms.
func TestProgressDelay(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if c, err := nixl.ConfigFromEnv(env(map[string]string{})); err != nil || c.ProgressDelay != time.Millisecond {
		t.Fatalf("default: %v %v", c.ProgressDelay, err)
	}
	for _, bad := range []string{"0", "0s", "-1ms", "soon"} {
		if _, err := nixl.ConfigFromEnv(env(map[string]string{nixl.EnvProgress: bad})); !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("%s=%q: %v, want invalid-argument", nixl.EnvProgress, bad, err)
		}
	}
}

func newPair(t *testing.T, bin string, env []string) *nocanceltest.Pair {
	needFakes(t)
	if testing.Verbose() {
		return nocanceltest.NewPair(t, bin, env, nil, nil, os.Stderr)
	}
	return nocanceltest.NewPair(t, bin, env, nil, nil, nil)
}

func TestHealthyWrite(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv())
	b := p.Write(4096, 3<<20, 256<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	c, err := p.Wait(b.ID, 10*time.Second)
	if err != nil || c.Status != sdk.Succeeded || !p.Landed(4096, 3<<20) {
		t.Fatalf("completion %+v err %v", c, err)
	}
}

// IN_PROG for as long as the target is stopped: InDoubt at the deadline,
// the request kept (release is not cancel), the bytes land after SIGCONT.
func TestInProgressForever(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv())
	o, err := nocanceltest.StoppedTarget(p, 1<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(o)
	if o.Broken != "" || o.Completion.Status != sdk.InDoubt || !o.LateLanded {
		t.Fatalf("IN_PROG forever: %v", o)
	}
}

// ERROR_BACKEND while the bytes still land: InDoubt; and the variant that
// takes the error as proof is caught.
func TestBackendErrorThenLanding(t *testing.T) {
	env := fakeEnv("KVFENCE_FAKE_STATUS_TIMEOUT_MS=300")
	p := newPair(t, pluginBin, env)
	o, err := nocanceltest.StoppedTarget(p, 1<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("honest:", o)
	if o.Broken != "" || o.Completion.Status != sdk.InDoubt || !o.LateLanded {
		t.Fatalf("honest plugin: %v", o)
	}
	u := newPair(t, unsafeBin, append(env, "KVFENCE_NIXL_UNSAFE=failed-is-definite"))
	o, err = nocanceltest.StoppedTarget(u, 1<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("dishonest:", o)
	if o.Completion.Status != sdk.FailedDefinite || o.Broken != nocanceltest.PromiseFailed {
		t.Fatalf("the failed-is-definite variant was not caught: %v", o)
	}
}

// TestRealLibrary runs the scenarios against a real NIXL build (UCX over
// TCP, loopback), only when KVFENCE_NIXL_LIB is set.
func TestRealLibrary(t *testing.T) {
	lib := os.Getenv(nixl.EnvLib)
	if lib == "" {
		t.Skip("skipped: KVFENCE_NIXL_LIB is not set (no real NIXL library to test against)")
	}
	p := nocanceltest.NewPair(t, pluginBin, []string{nixl.EnvLib + "=" + lib, "UCX_TLS=tcp", nixl.EnvReportAfter + "=10s"}, nil, nil, os.Stderr)
	o, err := nocanceltest.StoppedTarget(p, 2<<20, 256<<10, 64<<10, 60*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("stopped target:", o)
	if o.Broken != "" {
		t.Fatalf("broke %q: %v", o.Broken, o)
	}
}
