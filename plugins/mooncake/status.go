package mooncake

import (
	"fmt"

	"github.com/kvfence/kvfence/plugins/internal/nocancel"
	"github.com/kvfence/kvfence/sdk"
)

// Mooncake's task status codes (transfer_engine_c.h).
const (
	statusWaiting   = 0
	statusPending   = 1
	statusInvalid   = 2
	statusCanceled  = 3
	statusCompleted = 4
	statusTimeout   = 5
	statusFailed    = 6
)

// StateOf maps a task status code; an unknown code is Unknown (InDoubt).
func StateOf(code int) nocancel.TaskState {
	switch code {
	case statusWaiting:
		return nocancel.Waiting
	case statusPending:
		return nocancel.Pending
	case statusInvalid:
		return nocancel.Invalid
	case statusCanceled:
		return nocancel.Canceled
	case statusCompleted:
		return nocancel.Completed
	case statusTimeout:
		return nocancel.Timeout
	case statusFailed:
		return nocancel.Failed
	}
	return nocancel.Unknown
}

// Mooncake's return codes that this plugin tells apart.
var rcNames = map[int]string{
	1: "InvalidArgument", 2: "TooManyRequests", 3: "AddressNotRegistered", 4: "BatchBusy",
	6: "DeviceNotFound", 7: "AddressOverlapped", 8: "NotSupportedTransport", 101: "Dns", 102: "Socket",
	104: "RejectHandshake", 200: "Metadata", 201: "Endpoint", 999: "NotImplemented",
}

func rcName(rc int) string {
	if n, ok := rcNames[rc]; ok {
		return fmt.Sprintf("%s (%d)", n, rc)
	}
	return fmt.Sprintf("rc %d", rc)
}

// classOf classifies a refused call (negative codes are the library's
// negated forms of the same errors).
func classOf(rc int) sdk.Class {
	if rc < 0 {
		rc = -rc
	}
	switch rc {
	case 1, 3, 7:
		return sdk.ClassInvalidArgument
	case 2:
		return sdk.ClassResourceExhausted
	case 8, 999:
		return sdk.ClassUnimplemented
	}
	return sdk.ClassUnavailable
}
