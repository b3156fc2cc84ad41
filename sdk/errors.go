package sdk

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Class is the small, closed set of error classes of the contract (in the
// style of containerd's errdefs). Callers branch on classes, never on strings.
type Class uint8

const (
	ClassUnknown            Class = 0
	ClassInvalidArgument    Class = 1
	ClassNotFound           Class = 2
	ClassAlreadyExists      Class = 3
	ClassUnavailable        Class = 4
	ClassFailedPrecondition Class = 5
	ClassResourceExhausted  Class = 6
	ClassUnimplemented      Class = 7
	ClassInternal           Class = 8
)

var classNames = map[Class]string{
	ClassUnknown:            "unknown",
	ClassInvalidArgument:    "invalid-argument",
	ClassNotFound:           "not-found",
	ClassAlreadyExists:      "already-exists",
	ClassUnavailable:        "unavailable",
	ClassFailedPrecondition: "failed-precondition",
	ClassResourceExhausted:  "resource-exhausted",
	ClassUnimplemented:      "unimplemented",
	ClassInternal:           "internal",
}

func (c Class) String() string {
	if n, ok := classNames[c]; ok {
		return n
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// classToCode and codeToClass are inverse on the classes; gRPC codes with no
// class of their own fold into the nearest one (see CodeToClass).
var classToCode = map[Class]codes.Code{
	ClassUnknown:            codes.Unknown,
	ClassInvalidArgument:    codes.InvalidArgument,
	ClassNotFound:           codes.NotFound,
	ClassAlreadyExists:      codes.AlreadyExists,
	ClassUnavailable:        codes.Unavailable,
	ClassFailedPrecondition: codes.FailedPrecondition,
	ClassResourceExhausted:  codes.ResourceExhausted,
	ClassUnimplemented:      codes.Unimplemented,
	ClassInternal:           codes.Internal,
}

// Code maps a class to its gRPC code.
func (c Class) Code() codes.Code {
	if code, ok := classToCode[c]; ok {
		return code
	}
	return codes.Unknown
}

// CodeToClass maps a gRPC code back to a class. Codes without a class of
// their own fold conservatively: deadline/cancel/abort look like a peer that
// could not answer (Unavailable: the caller must not infer that nothing
// happened), OutOfRange is an invalid argument, PermissionDenied and
// Unauthenticated are preconditions, DataLoss is internal.
func CodeToClass(code codes.Code) Class {
	switch code {
	case codes.OK:
		return ClassUnknown
	case codes.InvalidArgument, codes.OutOfRange:
		return ClassInvalidArgument
	case codes.NotFound:
		return ClassNotFound
	case codes.AlreadyExists:
		return ClassAlreadyExists
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return ClassUnavailable
	case codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated:
		return ClassFailedPrecondition
	case codes.ResourceExhausted:
		return ClassResourceExhausted
	case codes.Unimplemented:
		return ClassUnimplemented
	case codes.Internal, codes.DataLoss:
		return ClassInternal
	}
	return ClassUnknown
}

// Error is a classified error. Every error crossing the contract is one.
type Error struct {
	Class Class
	Msg   string
}

func (e *Error) Error() string { return e.Class.String() + ": " + e.Msg }

// GRPCStatus lets grpc-go turn an *Error into a status with its class's code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Class.Code(), e.Msg) }

// Is makes errors.Is(err, &Error{Class: c}) match on class alone.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Msg == "" && t.Class == e.Class
	}
	return false
}

// Errorf builds a classified error.
func Errorf(class Class, format string, args ...any) *Error {
	return &Error{Class: class, Msg: fmt.Sprintf(format, args...)}
}

// ClassOf returns the class of err: the class of an *Error in its chain, the
// class of its gRPC status, Unavailable for context errors, else Unknown.
func ClassOf(err error) Class {
	if err == nil {
		return ClassUnknown
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return ClassUnavailable
	}
	if s, ok := status.FromError(err); ok {
		return CodeToClass(s.Code())
	}
	return ClassUnknown
}

// IsClass reports whether err has class c.
func IsClass(err error, c Class) bool { return err != nil && ClassOf(err) == c }

// toStatusError turns any error into a gRPC status error for the wire: a
// classified error keeps its class; an unclassified one becomes Internal
// (a plugin bug: the contract demands classified errors).
func toStatusError(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return status.Error(e.Class.Code(), e.Msg)
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// fromStatusError turns a gRPC error from the plugin into a classified error.
func fromStatusError(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return &Error{Class: CodeToClass(s.Code()), Msg: s.Message()}
	}
	return &Error{Class: ClassOf(err), Msg: err.Error()}
}
