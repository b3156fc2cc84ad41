// Package dltest builds the small fake C libraries that this project's
// plugin tests load in place of a vendor's library.
//
// It owns compiling C sources with the system C compiler into a shared
// object. It must never fetch or build a vendor's code.
package dltest

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildSharedLib compiles srcs (paths) into dir/name with gcc and returns
// its path. The test is skipped, saying why, when gcc is missing (make deps
// installs it; CI has it).
func BuildSharedLib(t testing.TB, dir, name string, srcs ...string) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: cannot build the fake C library (apt-get install gcc)")
	}
	out := filepath.Join(dir, name)
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread", "-o", out}, srcs...)
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, b)
	}
	return out
}
