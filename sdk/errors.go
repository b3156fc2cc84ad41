package sdk

import (
	"google.golang.org/grpc/codes"

	"github.com/kvfence/kvfence/errdefs"
)

// Class is the small, closed set of error classes of the contract: the
// project's one vocabulary, package errdefs (containerd style). Callers
// branch on classes, never on strings.
type Class = errdefs.Class

const (
	ClassUnknown            = errdefs.Unknown
	ClassInvalidArgument    = errdefs.InvalidArgument
	ClassNotFound           = errdefs.NotFound
	ClassAlreadyExists      = errdefs.AlreadyExists
	ClassUnavailable        = errdefs.Unavailable
	ClassFailedPrecondition = errdefs.FailedPrecondition
	ClassResourceExhausted  = errdefs.ResourceExhausted
	ClassUnimplemented      = errdefs.Unimplemented
	ClassInternal           = errdefs.Internal
)

// Error is a classified error. Every error crossing the contract is one.
type Error = errdefs.Error

// Errorf builds a classified error.
func Errorf(class Class, format string, args ...any) *Error {
	return errdefs.Errorf(class, format, args...)
}

// CodeToClass maps a gRPC code back to a class (errdefs.FromCode).
func CodeToClass(code codes.Code) Class { return errdefs.FromCode(code) }

// ClassOf returns the class of err (errdefs.ClassOf).
func ClassOf(err error) Class { return errdefs.ClassOf(err) }

// IsClass reports whether err has class c.
func IsClass(err error, c Class) bool { return errdefs.Is(err, c) }

// toStatusError turns any error into a gRPC status error for the wire: a
// classified error keeps its class; an unclassified one becomes Internal
// (a plugin bug: the contract demands classified errors).
func toStatusError(err error) error { return errdefs.ToGRPC(err) }

// fromStatusError turns a gRPC error from the plugin into a classified error.
func fromStatusError(err error) error { return errdefs.FromGRPC(err) }
