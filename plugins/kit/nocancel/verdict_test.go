package nocancel

import (
	"testing"

	"github.com/kvfence/kvfence/sdk"
)

// The verdict table against the behaviours measured on the real libraries
// (../shared/research/backends-measured.md).
func TestVerdict(t *testing.T) {
	const L = 1 << 20
	tk := func(s TaskState, reported uint64) Task { return Task{State: s, Length: L, Reported: reported} }
	cases := []struct {
		name              string
		tasks             []Task
		confirms, expired bool
		ok                bool
		want              sdk.Status
		landed            uint64
	}{
		{"all completed, v2/RDMA", []Task{tk(Completed, L), tk(Completed, L)}, true, false, true, sdk.Succeeded, 2 * L},
		{"legacy framing: COMPLETED before the target applied", []Task{tk(Completed, L)}, false, false, true, sdk.InDoubt, 0},
		{"FAILED: bytes land after it (stopped target resumed)", []Task{tk(Failed, 0)}, true, false, true, sdk.InDoubt, 0},
		{"FAILED while another task still waits", []Task{tk(Failed, 0), tk(Waiting, 0)}, true, false, true, sdk.InDoubt, 0},
		{"TIMEOUT is a label", []Task{tk(Timeout, 0)}, true, false, true, sdk.InDoubt, 0},
		{"CANCELED is not proof either", []Task{tk(Canceled, 0)}, true, false, true, sdk.InDoubt, 0},
		{"unknown code", []Task{tk(Unknown, 0)}, true, false, true, sdk.InDoubt, 0},
		{"WAITING: keep waiting", []Task{tk(Waiting, 0)}, true, false, false, 0, 0},
		{"WAITING forever: report InDoubt at the deadline", []Task{tk(Waiting, 0), tk(Completed, L)}, true, true, true, sdk.InDoubt, L},
		{"PENDING forever", []Task{tk(Pending, 0)}, true, true, true, sdk.InDoubt, 0},
		// Mooncake reported transferred_bytes = 0 after part of a write had
		// landed, and may report bytes for a task that did not complete:
		// BytesLanded counts only confirmed tasks, never Reported.
		{"transferred_bytes is not a lower bound", []Task{tk(Failed, L), tk(Completed, 0)}, true, false, true, sdk.InDoubt, L},
	}
	for _, c := range cases {
		got, ok := Verdict(c.tasks, c.confirms, c.expired)
		if ok != c.ok || (ok && (got.Status != c.want || got.BytesLanded != c.landed)) {
			t.Errorf("%s: got %v ok=%v landed=%d (%s), want %v ok=%v landed=%d", c.name, got.Status, ok, got.BytesLanded, got.Detail, c.want, c.ok, c.landed)
		}
		if ok && got.Status == sdk.FailedDefinite {
			t.Errorf("%s: FailedDefinite from a poll", c.name)
		}
	}
}

func TestCleanOnlyConfirmed(t *testing.T) {
	for s := Waiting; s <= Unknown; s++ {
		for _, conf := range []bool{false, true} {
			if want := s == Completed && conf; Clean(Task{State: s}, conf) != want {
				t.Errorf("Clean(%v, confirms=%v) = %v", s, conf, !want)
			}
		}
	}
}
