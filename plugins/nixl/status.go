package nixl

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// NIXL C API statuses. The C API folds NIXL's own codes (REMOTE_DISCONNECT,
// CANCELED, NOT_ALLOWED, ...) into BACKEND.
const (
	capiSuccess      = 0
	capiInProgress   = 1
	capiInvalidParam = -1
	capiBackend      = -2
	capiInvalidState = -3
	capiException    = -4
	capiNoTelemetry  = -5
	capiNotFound     = -6 // agent metadata not loaded, or no backend serves the request
)

// Codes the versioned C API (0.1) adds, one per NIXL status. As task
// statuses they are errors like the rest (Failed: InDoubt).
var v01Names = map[int]string{
	-7: "ERROR_NOT_POSTED", -8: "ERROR_MISMATCH", -9: "ERROR_NOT_ALLOWED", -10: "ERROR_REPOST_ACTIVE",
	-11: "ERROR_UNKNOWN", -12: "ERROR_NOT_SUPPORTED", -13: "ERROR_REMOTE_DISCONNECT", -14: "ERROR_CANCELED",
}

// StateOf maps a transfer request's status. Every error is Failed (InDoubt):
// measured, a target that deregistered its buffer still received a write,
// and release does not cancel.
func StateOf(code int) nocancel.TaskState {
	switch {
	case code == capiSuccess:
		return nocancel.Completed
	case code == capiInProgress:
		return nocancel.Pending
	case code < 0:
		return nocancel.Failed
	}
	return nocancel.Unknown
}

func statusName(rc int) string {
	switch rc {
	case capiSuccess:
		return "SUCCESS"
	case capiInProgress:
		return "IN_PROG"
	case capiInvalidParam:
		return "ERROR_INVALID_PARAM (-1)"
	case capiBackend:
		return "ERROR_BACKEND (-2)"
	case capiInvalidState:
		return "ERROR_INVALID_STATE (-3)"
	case capiException:
		return "ERROR_EXCEPTION (-4)"
	case capiNoTelemetry:
		return "ERROR_NO_TELEMETRY (-5)"
	case capiNotFound:
		return "ERROR_NOT_FOUND (-6)"
	}
	if n, ok := v01Names[rc]; ok {
		return fmt.Sprintf("%s (%d)", n, rc)
	}
	return fmt.Sprintf("status %d", rc)
}

func classOf(rc int) errdefs.Class {
	switch rc {
	case capiInvalidParam:
		return errdefs.InvalidArgument
	case capiInvalidState:
		return errdefs.FailedPrecondition
	case capiNotFound:
		return errdefs.NotFound
	case -12:
		return errdefs.Unimplemented
	}
	return errdefs.Unavailable
}
