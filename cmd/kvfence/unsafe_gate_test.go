package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// runCLI runs the kvfence binary exe with args and returns its exit status
// and stderr.
func runCLI(t *testing.T, exe string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("%s %v: %v", exe, args, err)
	return -1, ""
}

// Issue 15, finding 8: a default build must not run a known-unsafe core,
// whichever command asks. Each refusal is one line naming the build tag,
// with exit status 2, before any process or plugin starts.
func TestDefaultBuildRefusesUnsafeVariants(t *testing.T) {
	for _, args := range [][]string{
		{"__agent", "--unsafe", "release-on-abort"},
		{"__agent", "--role", "prefill", "--unsafe", "ack-after-failed-send"},
		{"demo", "--unsafe", "release-on-abort"},
		{"bench"},
	} {
		code, stderr := runCLI(t, agentExe, args...)
		if code != 2 {
			t.Errorf("kvfence %s: exit %d, want 2 (stderr %q)", strings.Join(args, " "), code, stderr)
		}
		if lines := strings.Count(strings.TrimRight(stderr, "\n"), "\n") + 1; lines != 1 || !strings.Contains(stderr, "-tags kvfenceunsafe") {
			t.Errorf("kvfence %s: want one line naming -tags kvfenceunsafe, got %q", strings.Join(args, " "), stderr)
		}
	}
	// An unknown name is refused the same way in any build.
	if code, stderr := runCLI(t, agentExe, "demo", "--unsafe", "no-such-variant"); code != 2 || !strings.Contains(stderr, "unknown core variant") {
		t.Errorf("unknown variant: exit %d, stderr %q", code, stderr)
	}
}

// The tagged build accepts the same flag: the variant passes and the next
// check (a bogus role) is what refuses the command line.
func TestTaggedBuildAcceptsUnsafeVariants(t *testing.T) {
	exe := unsafeBinary(t)
	code, stderr := runCLI(t, exe, "__agent", "--role", "bogus", "--unsafe", "release-on-abort")
	if code != 2 || strings.Contains(stderr, "kvfenceunsafe") || !strings.Contains(stderr, "--role") {
		t.Fatalf("tagged build: want the variant accepted and the role refused, got exit %d, stderr %q", code, stderr)
	}
	// The demo takes only the variants its faults can show; the others
	// would report corrupt pages 0 as if they were safe.
	if code, stderr := runCLI(t, exe, "demo", "--unsafe", "no-tombstones"); code != 2 || !strings.Contains(stderr, "kvfence sim") {
		t.Fatalf("demo --unsafe no-tombstones: exit %d, stderr %q", code, stderr)
	}
	// release-on-drain-ack needs a lying rank, which the demo does not have.
	if code, stderr := runCLI(t, exe, "demo", "--unsafe", "release-on-drain-ack"); code != 2 || !strings.Contains(stderr, "lying prefill rank") ||
		strings.Count(strings.TrimRight(stderr, "\n"), "\n") != 0 {
		t.Fatalf("demo --unsafe release-on-drain-ack: exit %d, stderr %q", code, stderr)
	}
}
