package core

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
)

// Error classes. Every error the core returns wraps exactly one of them, so
// a caller can map it (errors.Is, errdefs.ClassOf) to a gRPC code or an
// engine status without reading strings. They are the project's classes
// (package errdefs), named here for the core's callers.
var (
	ErrInvalidArgument    = errdefs.InvalidArgument
	ErrNotFound           = errdefs.NotFound
	ErrAlreadyExists      = errdefs.AlreadyExists
	ErrResourceExhausted  = errdefs.ResourceExhausted
	ErrFailedPrecondition = errdefs.FailedPrecondition
	ErrUnavailable        = errdefs.Unavailable
)

func errorf(class error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", class, fmt.Sprintf(format, args...))
}
