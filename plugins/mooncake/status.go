package mooncake

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
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

// Mooncake's return codes. The C API returns two sets: submitTransfer
// returns Status::Code (positive, common/base/status.h), most other calls
// the negative codes of error.h, which differ beyond -8 (error.h has
// ERR_NOT_IMPLEMENTED -303 where Status has kNotImplemented 999).
var statusNames = map[int]string{
	1: "InvalidArgument", 2: "TooManyRequests", 3: "AddressNotRegistered", 4: "BatchBusy",
	6: "DeviceNotFound", 7: "AddressOverlapped", 8: "NotSupportedTransport", 101: "Dns", 102: "Socket",
	103: "MalformedJson", 104: "RejectHandshake", 200: "Metadata", 201: "Endpoint", 202: "Context",
	300: "Numa", 301: "Clock", 302: "Memory", 999: "NotImplemented",
}

var errorNames = map[int]string{
	-1: "ERR_INVALID_ARGUMENT", -2: "ERR_TOO_MANY_REQUESTS", -3: "ERR_ADDRESS_NOT_REGISTERED", -4: "ERR_BATCH_BUSY",
	-6: "ERR_DEVICE_NOT_FOUND", -7: "ERR_ADDRESS_OVERLAPPED", -101: "ERR_DNS", -102: "ERR_SOCKET",
	-103: "ERR_MALFORMED_JSON", -104: "ERR_REJECT_HANDSHAKE", -200: "ERR_METADATA", -201: "ERR_ENDPOINT",
	-202: "ERR_CONTEXT", -300: "ERR_NUMA", -301: "ERR_CLOCK", -302: "ERR_MEMORY", -303: "ERR_NOT_IMPLEMENTED",
}

func rcName(rc int) string {
	if n, ok := statusNames[rc]; ok {
		return fmt.Sprintf("%s (%d)", n, rc)
	}
	if n, ok := errorNames[rc]; ok {
		return fmt.Sprintf("%s (%d)", n, rc)
	}
	return fmt.Sprintf("rc %d", rc)
}

// classOf classifies a refused call by either code set.
func classOf(rc int) errdefs.Class {
	switch rc {
	case 1, -1, 3, -3, 7, -7, 103, -103:
		return errdefs.InvalidArgument
	case 2, -2, 302, -302:
		return errdefs.ResourceExhausted
	case 8, 999, -303:
		return errdefs.Unimplemented
	}
	return errdefs.Unavailable
}
