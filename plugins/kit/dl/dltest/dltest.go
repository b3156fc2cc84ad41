// Package dltest builds the small fake C libraries that this project's
// plugin tests load in place of a vendor's library.
//
// It owns compiling C sources with the system C compiler into a shared
// object. It must never fetch or build a vendor's code.
package dltest

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
)

// ErrNoCompiler: gcc is not installed (make deps installs it; CI has it).
var ErrNoCompiler = errors.New("gcc not found: cannot build the fake C library (apt-get install gcc)")

// Build compiles srcs (paths, and -D flags) into dir/name with gcc and
// returns its path.
func Build(dir, name string, srcs ...string) (string, error) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		return "", ErrNoCompiler
	}
	out := filepath.Join(dir, name)
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread", "-o", out}, srcs...)
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc %v: %v\n%s", args, err, b)
	}
	return out, nil
}

// BuildSharedLib is Build for a test: skipped, saying why, without gcc.
func BuildSharedLib(t testing.TB, dir, name string, srcs ...string) string {
	t.Helper()
	out, err := Build(dir, name, srcs...)
	if errors.Is(err, ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}
