package errdefs

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a classified error with a message.
type Error struct {
	Class Class
	Msg   string
}

func (e *Error) Error() string { return e.Class.String() + ": " + e.Msg }

// GRPCStatus lets grpc-go turn an *Error into a status with its class's code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Class.Code(), e.Msg) }

// Is matches a Class (errors.Is(err, NotFound)) and an *Error without a
// message (errors.Is(err, &Error{Class: NotFound})) on the class alone.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case Class:
		return e.Class == t
	case *Error:
		return t.Msg == "" && t.Class == e.Class
	}
	return false
}

// Errorf builds a classified error.
func Errorf(class Class, format string, args ...any) *Error {
	return &Error{Class: class, Msg: fmt.Sprintf(format, args...)}
}

// ClassOf returns the class of err: that of an *Error or a Class in its
// chain, that of its gRPC status, Unavailable for context errors (a timeout
// is never evidence that nothing happened), else Unknown.
func ClassOf(err error) Class {
	if err == nil {
		return Unknown
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	var c Class
	if errors.As(err, &c) {
		return c
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Unavailable
	}
	if s, ok := status.FromError(err); ok {
		return FromCode(s.Code())
	}
	return Unknown
}

// Is reports whether err has class c (nil has none).
func Is(err error, c Class) bool { return err != nil && ClassOf(err) == c }

func IsInvalidArgument(err error) bool    { return Is(err, InvalidArgument) }
func IsNotFound(err error) bool           { return Is(err, NotFound) }
func IsAlreadyExists(err error) bool      { return Is(err, AlreadyExists) }
func IsUnavailable(err error) bool        { return Is(err, Unavailable) }
func IsFailedPrecondition(err error) bool { return Is(err, FailedPrecondition) }
func IsResourceExhausted(err error) bool  { return Is(err, ResourceExhausted) }
func IsUnimplemented(err error) bool      { return Is(err, Unimplemented) }
func IsInternal(err error) bool           { return Is(err, Internal) }

// ToGRPC turns any error into a gRPC status error for the wire: a classified
// error keeps its class; an unclassified one becomes Internal (whoever
// returned it broke the rule that every error is classified).
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return status.Error(e.Class.Code(), e.Msg)
	}
	var c Class
	if errors.As(err, &c) {
		return status.Error(c.Code(), err.Error())
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// FromGRPC turns an error received over gRPC into a classified *Error.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return &Error{Class: FromCode(s.Code()), Msg: s.Message()}
	}
	return &Error{Class: ClassOf(err), Msg: err.Error()}
}
