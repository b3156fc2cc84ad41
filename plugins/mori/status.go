package mori

import "github.com/kvfence/kvfence/plugins/kit/nocancel"

// MORI-IO StatusCode values (passed through by the shim).
const (
	statusSuccess    = 0
	statusInit       = 1
	statusInProgress = 2
	statusErrBegin   = 10 // errors are above: invalid args 11, not found 12, RDMA op 13, bad state 14, GPU op 15
)

// StateOf maps a write's status. An error is Failed (InDoubt): the first
// error completion marks a transfer failed while its other queue pairs may
// still be writing, and MORI has no cancel.
func StateOf(code int) nocancel.TaskState {
	switch {
	case code == statusSuccess:
		return nocancel.Completed
	case code == statusInit:
		return nocancel.Waiting
	case code == statusInProgress:
		return nocancel.Pending
	case code > statusErrBegin:
		return nocancel.Failed
	}
	return nocancel.Unknown
}
