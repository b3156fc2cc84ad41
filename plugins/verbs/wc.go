package verbs

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
)

// WCStatus mirrors enum ibv_wc_status (infiniband/verbs.h); the values are
// the ABI and are checked against the header in the cgo build (ibv.go).
type WCStatus uint32

const (
	WCSuccess         WCStatus = 0
	WCLocLenErr       WCStatus = 1
	WCLocQPOpErr      WCStatus = 2
	WCLocEECOpErr     WCStatus = 3
	WCLocProtErr      WCStatus = 4
	WCWRFlushErr      WCStatus = 5
	WCMWBindErr       WCStatus = 6
	WCBadRespErr      WCStatus = 7
	WCLocAccessErr    WCStatus = 8
	WCRemInvReqErr    WCStatus = 9
	WCRemAccessErr    WCStatus = 10
	WCRemOpErr        WCStatus = 11
	WCRetryExcErr     WCStatus = 12
	WCRNRRetryExcErr  WCStatus = 13
	WCLocRDDViolErr   WCStatus = 14
	WCRemInvRDReqErr  WCStatus = 15
	WCRemAbortErr     WCStatus = 16
	WCInvEECNErr      WCStatus = 17
	WCInvEECStateErr  WCStatus = 18
	WCFatalErr        WCStatus = 19
	WCRespTimeoutErr  WCStatus = 20
	WCGeneralErr      WCStatus = 21
	wcStatusLastKnown          = WCGeneralErr
)

var wcNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "work request flushed", "memory window bind error", "bad response",
	"local access error", "remote invalid request", "remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation",
	"remote invalid RD request", "remote aborted", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout", "general error",
}

func (s WCStatus) String() string {
	if int(s) < len(wcNames) {
		return fmt.Sprintf("%s (%d)", wcNames[s], uint32(s))
	}
	return fmt.Sprintf("wc-status(%d)", uint32(s))
}

// class is the contract's error class for a non-success completion: why a
// batch did not succeed. Remote access means the key was unknown, revoked or
// the range outside the window; retry-exceeded means the peer did not answer.
func (s WCStatus) class() errdefs.Class {
	switch s {
	case WCSuccess:
		return errdefs.Unknown
	case WCRemAccessErr, WCRemInvReqErr:
		return errdefs.FailedPrecondition
	case WCRetryExcErr, WCRNRRetryExcErr, WCRespTimeoutErr, WCWRFlushErr:
		return errdefs.Unavailable
	case WCLocLenErr, WCLocProtErr, WCLocAccessErr:
		return errdefs.InvalidArgument
	}
	return errdefs.Internal
}
