package nocanceltest

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// allThreadsStopped tells a running process from a stopped one (Stop relies
// on it to close the race between SIGSTOP and the next write).
func TestAllThreadsStopped(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep(1):", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	if allThreadsStopped(pid) {
		t.Fatal("a running process reads as stopped")
	}
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	deadline := time.Now().Add(30 * time.Second) // one event; generous for a loaded machine
	for !allThreadsStopped(pid) {
		if time.Now().After(deadline) {
			t.Fatal("a SIGSTOPped process never reads as stopped")
		}
		time.Sleep(time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	time.Sleep(50 * time.Millisecond)
	if allThreadsStopped(pid) {
		t.Fatal("a resumed process still reads as stopped")
	}
	if allThreadsStopped(1 << 30) {
		t.Fatal("a missing process reads as stopped")
	}
}
