package core

import (
	"errors"
	"fmt"
)

// Error classes. Every error the core returns wraps exactly one of them, so
// a caller can map it (errors.Is) to a gRPC code or an engine status without
// reading strings.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrFailedPrecondition = errors.New("failed precondition")
)

func errorf(class error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", class, fmt.Sprintf(format, args...))
}
