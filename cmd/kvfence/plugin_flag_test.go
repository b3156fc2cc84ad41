package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/internal/demo"
	"github.com/kvfence/kvfence/sdk"
)

var (
	mooncakeOnce sync.Once
	mooncakeErr  error
)

// mooncakeBeside builds kvfence-plugin-mooncake next to the test's kvfence
// binaries (once), where --plugin mooncake finds it by name.
func mooncakeBeside(t *testing.T) {
	t.Helper()
	mooncakeOnce.Do(func() {
		out, err := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(agentExe), "kvfence-plugin-mooncake"),
			"github.com/kvfence/kvfence/plugins/mooncake/cmd/kvfence-plugin-mooncake").CombinedOutput()
		if err != nil {
			mooncakeErr = errors.New(err.Error() + "\n" + string(out))
		}
	})
	if mooncakeErr != nil {
		t.Fatal(mooncakeErr)
	}
}

// --plugin is checked before any rank starts: an unknown name, a path that
// is not there or a plugin not built is one line, exit 2, saying what to
// do; a vendor plugin without its library fails with its own classified
// line (naming the variable) once, and a non-zero exit.
func TestPluginFlagRefusals(t *testing.T) {
	bench := unsafeBinary(t) // bench refuses a default build first
	for _, c := range []struct {
		exe  string
		args []string
		want string
	}{
		{agentExe, []string{"demo", "--plugin", "nosuch"}, `--plugin "nosuch": not one of mooncake|mori|nixl|tcp|verbs`},
		{bench, []string{"bench", "--plugin", "nosuch"}, `--plugin "nosuch": not one of`},
		{agentExe, []string{"__agent", "--plugin", "nosuch"}, `--plugin "nosuch": not one of`},
		{agentExe, []string{"demo", "--plugin", "./no-such-plugin"}, "--plugin ./no-such-plugin: stat ./no-such-plugin: no such file"},
		{agentExe, []string{"demo", "--plugin", "nixl"}, "kvfence-plugin-nixl not found in " + filepath.Dir(agentExe) + ", bin; run make plugins"},
		{bench, []string{"bench", "--plugin", "mori"}, "kvfence-plugin-mori not found in"},
		{agentExe, []string{"__agent", "--plugin", "nixl"}, "run make plugins"},
		{agentExe, []string{"demo", "--plugin", "verbs"}, "go build -tags rdma -o bin/kvfence-plugin-verbs"},
		{agentExe, []string{"demo", "--plugin", "nixl", "--restart-decode-after", "1s"}, "it does not take --plugin nixl"},
	} {
		code, stderr := runCLI(t, c.exe, c.args...)
		line := strings.TrimRight(stderr, "\n")
		if code != 2 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "kvfence: ") || !strings.Contains(line, c.want) {
			t.Errorf("kvfence %s: exit %d, stderr %q; want exit 2 and one line with %q", strings.Join(c.args, " "), code, stderr, c.want)
		}
	}

	mooncakeBeside(t)
	t.Setenv("KVFENCE_MOONCAKE_LIB", "")
	os.Unsetenv("KVFENCE_MOONCAKE_LIB")
	t.Setenv("LD_LIBRARY_PATH", t.TempDir())
	const why = "KVFENCE_MOONCAKE_LIB is not set and libtransfer_engine.so is not on the library path"
	for _, c := range []struct {
		exe  string
		args []string
	}{
		{agentExe, []string{"demo", "--plugin", "mooncake", "--quiet"}},
		{bench, []string{"bench", "--plugin", "mooncake"}},
	} {
		code, stderr := runCLI(t, c.exe, c.args...)
		line := strings.TrimRight(stderr, "\n")
		if code == 0 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "kvfence: transport plugin kvfence-plugin-mooncake: failed-precondition: mooncake: ") ||
			strings.Count(line, why) != 1 {
			t.Errorf("kvfence %s without the library: exit %d, stderr %q; want one line with the plugin's reason", strings.Join(c.args, " "), code, stderr)
		}
	}
	// A lone agent logs to stderr too (go-plugin's note that the plugin
	// exited); the reason is its last line, said once.
	code, stderr := runCLI(t, agentExe, "__agent", "--role", "decode", "--plugin", "mooncake")
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if last := lines[len(lines)-1]; code == 0 || !strings.HasPrefix(last, "kvfence: transport plugin kvfence-plugin-mooncake: ") || strings.Count(stderr, why) != 1 {
		t.Errorf("__agent --plugin mooncake without the library: exit %d, stderr %q", code, stderr)
	}
}

// A transport that cannot revoke and whose writes may land for ~50 years
// is refused with the reason (exit 2) unless the run aborts nothing or a
// restart fence bounds its holds; a revoking or bounded one runs.
func TestDemoCanRunNeedsRevokeOrBoundedTail(t *testing.T) {
	unbounded := sdk.Info{Name: "kvfence-mooncake", Capabilities: sdk.Capabilities{MaxTail: 50 * 365 * 24 * time.Hour}}
	err := demoCanRun("mooncake", unbounded, 0.25, false)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "cannot revoke a window and declares a write tail of ~50 years") ||
		!strings.Contains(err.Error(), "--abort-share 0") || !strings.Contains(err.Error(), "--restart-fence-instances") {
		t.Fatalf("non-revoking, unbounded tail: %v", err)
	}
	if err := demoCanRun("mooncake", unbounded, 0, false); err != nil {
		t.Errorf("no aborts: %v", err)
	}
	if err := demoCanRun("mooncake", unbounded, 0.25, true); err != nil {
		t.Errorf("restart fence: %v", err)
	}
	revokes := unbounded
	revokes.Capabilities.Revoke = true
	if err := demoCanRun("x", revokes, 0.25, false); err != nil {
		t.Errorf("revoking: %v", err)
	}
	bounded := sdk.Info{Name: "b", Capabilities: sdk.Capabilities{MaxTail: time.Minute}}
	if err := demoCanRun("b", bounded, 0.25, false); err != nil {
		t.Errorf("bounded tail: %v", err)
	}
}

// lastLine keeps the last plain line, across split writes, and skips the
// plugin's JSON log lines.
func TestLastLine(t *testing.T) {
	var l lastLine
	for _, s := range []string{"first\n", `{"@level":"info"}` + "\n", "failed-pre", "condition: x\n", `{"@level":"warn"}` + "\n", "  \n"} {
		_, _ = l.Write([]byte(s))
	}
	if got := l.wait(0); got != "failed-precondition: x" {
		t.Fatalf("lastLine = %q", got)
	}
}

// The demo over the mooncake plugin, backed by this project's fake
// Transfer Engine library (plugins/mooncake/testdata; gcc): with aborts it
// refuses before any rank starts, naming why; without them every request
// hands off through real rank and plugin processes (the decode endpoint's
// opaque part reaches prefill's Connect) with 0 corrupt pages, and the
// summary says the per-exposure fence is off.
func TestDemoOverFakeMooncake(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: cannot build the fake Mooncake library (apt-get install gcc)")
	}
	mooncakeBeside(t)
	lib := filepath.Join(t.TempDir(), "libfake_transfer_engine.so")
	const src, wire = "../../plugins/mooncake/testdata/", "../../plugins/kit/nocancel/testdata/"
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-pthread", "-o", lib, "-I"+wire,
		src+"fake_transfer_engine.c", wire+"fakewire.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	t.Setenv("KVFENCE_MOONCAKE_LIB", lib)
	t.Setenv("TMPDIR", t.TempDir())
	code, stderr := runCLI(t, agentExe, "demo", "--plugin", "mooncake", "--quiet")
	if line := strings.TrimRight(stderr, "\n"); code != 2 || strings.Contains(line, "\n") ||
		!strings.Contains(line, "kvfence: --plugin mooncake: transport kvfence-mooncake cannot revoke a window") {
		t.Errorf("demo --plugin mooncake with aborts: exit %d, stderr %q; want the refusal, exit 2", code, stderr)
	}
	cmd := exec.Command(agentExe, "demo", "--plugin", "mooncake", "--quiet", "--json", "--abort-share", "0",
		"--requests", "16", "--concurrency", "4", "--page-every", "1ms", "--decode-for", "10ms")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("demo --plugin mooncake --abort-share 0: %v\n%s", err, out)
	}
	var s demo.Summary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if s.Handoffs != 16 || s.CorruptPages != 0 || s.Fence || s.PagesVerified == 0 {
		t.Fatalf("demo over the fake Mooncake library: %s", out)
	}
}
