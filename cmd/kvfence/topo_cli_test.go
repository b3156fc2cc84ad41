package main

import (
	"strings"
	"testing"
)

// topo refuses a sysfs root that is not there with exit 2 and one line.
func TestTopoRefusesMissingSysfs(t *testing.T) {
	code, stderr := runCLI(t, agentExe, "topo", "--no-gpu", "--sysfs", "/nonexistent-kvfence-sysfs")
	if code != 2 || !strings.Contains(stderr, "not a directory") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("topo --sysfs /nonexistent: exit %d, %q; want 2 and one line", code, stderr)
	}
}
