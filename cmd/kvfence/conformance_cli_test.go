package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 22, item 8: kvfence conformance over a plugin that exits before its
// handshake prints the plugin's own reason (its last line on stderr), once,
// and not only go-plugin's generic handshake error; it exits non-zero and
// writes no certificate.
func TestConformanceSaysWhyThePluginDidNotStart(t *testing.T) {
	mooncakeBeside(t)
	t.Setenv("KVFENCE_MOONCAKE_LIB", "")
	os.Unsetenv("KVFENCE_MOONCAKE_LIB")
	t.Setenv("LD_LIBRARY_PATH", t.TempDir())
	out := t.TempDir()
	plugin := filepath.Join(filepath.Dir(agentExe), "kvfence-plugin-mooncake")
	b, err := exec.Command(agentExe, "conformance", "--plugin", plugin, "--out", out).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("conformance of a plugin that cannot start: %v, want a non-zero exit\n%s", err, b)
	}
	const why = "mooncake: KVFENCE_MOONCAKE_LIB is not set and libtransfer_engine.so is not on the library path"
	if got := string(b); strings.Count(got, why) != 1 || strings.Contains(got, "Failed to read any lines") {
		t.Errorf("conformance output does not carry the plugin's reason once:\n%s", got)
	}
	if _, err := os.Stat(filepath.Join(out, "certificate.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("certificate.json after a plugin that did not start: %v", err)
	}
}
