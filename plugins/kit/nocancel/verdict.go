package nocancel

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// TaskState is a backend task's status in this package's words; each
// binding maps its own codes onto it (and an unknown code onto Unknown).
type TaskState uint8

const (
	// Waiting and Pending: the backend still works on the task.
	Waiting TaskState = iota
	Pending
	// Completed: the backend says the task is done. Whether that means the
	// target applied the bytes depends on the transport (Confirms).
	Completed
	// Failed, Timeout, Canceled, Invalid: the backend gave up on its
	// bookkeeping of the task; its bytes may still land (measured: Mooncake
	// over TCP lands every byte after FAILED once a stopped target resumes).
	Failed
	Timeout
	Canceled
	Invalid
	// Unknown: a code this plugin does not know.
	Unknown
)

var stateNames = [...]string{"WAITING", "PENDING", "COMPLETED", "FAILED", "TIMEOUT", "CANCELED", "INVALID", "UNKNOWN"}

func (s TaskState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Terminal: the backend will not change the task's status any more. It
// says nothing about the task's bytes.
func (s TaskState) Terminal() bool { return s >= Completed }

// Task is one polled task: its state, the length it was asked to move, and
// what the backend says it moved (never trusted as a lower bound: measured,
// Mooncake reports 0 after part of a write landed).
type Task struct {
	State    TaskState
	Length   uint64
	Reported uint64
}

// Verdict is the completion a batch earns from its tasks' states. confirms
// says whether Completed means applied at the target on this link (RDMA,
// Mooncake's v2 TCP framing, UCX's flushed write) rather than queued.
// expired says the plugin stopped waiting for the backend (a task still
// Waiting or Pending past the report deadline). It returns ok=false while
// the batch must still be waited on.
//
// Succeeded only when every task Completed on a confirming link; InDoubt in
// every other terminal case. FailedDefinite never: nothing a poll returns
// proves the bytes stopped.
func Verdict(tasks []Task, confirms, expired bool) (c sdk.Completion, ok bool) {
	var landed uint64
	var failed, running, unconfirmed int
	var first TaskState = Completed
	for _, t := range tasks {
		switch {
		case t.State == Completed && confirms:
			landed += t.Length // confirmed applied; Reported is ignored
		case t.State == Completed:
			unconfirmed++
		case t.State.Terminal():
			failed++
			if first == Completed {
				first = t.State
			}
		default:
			running++
		}
	}
	c.BytesLanded = landed
	switch {
	case failed > 0:
		// One task failed: the batch cannot succeed; the others may still
		// move, and so may the failed one.
		c.Status, c.Class = sdk.InDoubt, errdefs.Unavailable
		c.Detail = fmt.Sprintf("%d of %d tasks %v (the backend cannot cancel: bytes may still land); %d still running", failed, len(tasks), first, running)
		return c, true
	case running > 0 && !expired:
		return c, false
	case running > 0:
		c.Status, c.Class = sdk.InDoubt, errdefs.Unavailable
		c.Detail = fmt.Sprintf("%d of %d tasks still WAITING/PENDING past the report deadline (the backend has no timeout for them and cannot cancel)", running, len(tasks))
		return c, true
	case unconfirmed > 0:
		c.Status, c.Class = sdk.InDoubt, errdefs.Unavailable
		c.Detail = fmt.Sprintf("%d of %d tasks COMPLETED on a link where that means queued, not applied (legacy framing)", unconfirmed, len(tasks))
		return c, true
	}
	c.Status = sdk.Succeeded
	return c, true
}

// Clean says whether a task lets go of its source: only a completion the
// link confirms. After any other end the backend may still read the source
// (measured: Mooncake sends a FAILED task's bytes after freeBatchID).
func Clean(t Task, confirms bool) bool { return t.State == Completed && confirms }
