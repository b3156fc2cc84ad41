package dl_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/dl"
	"github.com/kvfence/kvfence/plugins/kit/dl/dltest"
)

var spec = dl.Spec{
	What: "fakevendor", EnvVar: "KVFENCE_FAKE_LIB", Names: []string{"libkvfence-no-such-vendor.so"},
	Required: []string{"fake_core_a", "fake_core_b", "fake_version"}, Optional: []string{"fake_newer"},
}

// build compiles testdata/fake.c with the given -D flags.
func build(t *testing.T, name string, defs ...string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "fake.c")
	b, err := exec.Command("cp", "testdata/fake.c", src).CombinedOutput()
	if err != nil {
		t.Fatalf("cp: %v %s", err, b)
	}
	args := []string{src}
	for _, d := range defs {
		args = append(args, "-D"+d)
	}
	return dltest.BuildSharedLib(t, dir, name, args...)
}

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

// oneClassifiedLine: every refusal is FailedPrecondition, on one line, and
// names the variable an operator must set.
func oneClassifiedLine(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatal("loaded, want a refusal")
	}
	if !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Errorf("class %v, want failed-precondition: %v", errdefs.ClassOf(err), err)
	}
	if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "KVFENCE_FAKE_LIB") || !strings.Contains(err.Error(), want) {
		t.Errorf("want one line naming KVFENCE_FAKE_LIB and %q, got %q", want, err)
	}
	t.Log(err)
}

func TestLibraryMissing(t *testing.T) {
	_, err := dl.Load(spec, env(nil))
	oneClassifiedLine(t, err, "not set")
	_, err = dl.Load(spec, env(map[string]string{"KVFENCE_FAKE_LIB": "/nonexistent/libfake.so"}))
	oneClassifiedLine(t, err, "cannot be loaded")
}

func TestRequiredSymbolMissing(t *testing.T) {
	path := build(t, "libfake.so", "FAKE_VERSION=1")
	s := spec
	s.Required = append(s.Required, "fake_core_c")
	_, err := dl.Load(s, env(map[string]string{"KVFENCE_FAKE_LIB": path}))
	oneClassifiedLine(t, err, "fake_core_c")
}

func TestOptionalSymbols(t *testing.T) {
	old := build(t, "libold.so", "FAKE_VERSION=1")
	lib, err := dl.Load(spec, env(map[string]string{"KVFENCE_FAKE_LIB": old}))
	if err != nil {
		t.Fatal(err)
	}
	if lib.Has("fake_newer") || lib.Sym("fake_core_a") == nil {
		t.Errorf("old library: newer=%v core=%v", lib.Has("fake_newer"), lib.Sym("fake_core_a"))
	}
	lib.Close()
	newer := build(t, "libnew.so", "FAKE_VERSION=2", "WITH_NEWER")
	lib, err = dl.Load(spec, env(map[string]string{"KVFENCE_FAKE_LIB": newer}))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	if !lib.Has("fake_newer") {
		t.Error("newer library: optional symbol not resolved")
	}
}

func TestRefuseVersion(t *testing.T) {
	path := build(t, "libfake.so", "FAKE_VERSION=1")
	lib, err := dl.Load(spec, env(map[string]string{"KVFENCE_FAKE_LIB": path}))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	oneClassifiedLine(t, lib.Refuse(spec, "version %d, want 2", 1), "unsupported version")
}
