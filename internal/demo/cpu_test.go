package demo

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// A rank's CPU counts the processes it started (its plugin process): a
// busy grandchild shows in its parent's tree and in ours, not in the
// parent alone. A probe that read only the rank process would miss the
// plugin's key calls, where the fence spends.
func TestTreeCPUCountsDescendants(t *testing.T) {
	parent := exec.Command("/bin/sh", "-c", "/bin/sh -c 'while :; do :; done' & wait")
	if err := parent.Start(); err != nil {
		t.Skipf("no /bin/sh: %v", err)
	}
	defer func() { _ = parent.Process.Kill(); _ = parent.Wait() }()
	var child int
	for deadline := time.Now().Add(time.Minute); child == 0; time.Sleep(10 * time.Millisecond) {
		if c := childrenOf(parent.Process.Pid); len(c) > 0 {
			child = c[0]
		} else if time.Now().After(deadline) {
			t.Fatal("the busy child never started")
		}
	}
	defer func() { _ = syscallKill(child) }()
	for deadline := time.Now().Add(time.Minute); treeCPU(child, false) < 100*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the busy child used %v of CPU in a minute", treeCPU(child, false))
		}
	}
	own, tree := treeCPU(parent.Process.Pid, false), treeCPU(parent.Process.Pid, true)
	if tree < own+100*time.Millisecond {
		t.Errorf("parent's tree %v, parent alone %v: the busy child is not counted", tree, own)
	}
	if ours := treeCPU(os.Getpid(), true); ours < tree {
		t.Errorf("this process's tree %v < its child's tree %v", ours, tree)
	}
	if gone := procCPU(1 << 30); gone != 0 {
		t.Errorf("a pid that does not exist used %v", gone)
	}
}

func TestCPUSampleSince(t *testing.T) {
	a := cpuSample{"decode": time.Second, "router": 0}
	a["prefill"] = time.Second // a killed rank: gone by the second sample
	b := cpuSample{"decode": 3 * time.Second, "router": 500 * time.Millisecond, "prefill": 0}
	got := b.since(a)
	if got["decode"] != 2 || got["router"] != 0.5 || got["prefill"] != 0 {
		t.Errorf("since: %v", got)
	}
}

func syscallKill(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
