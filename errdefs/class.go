package errdefs

import (
	"fmt"

	"google.golang.org/grpc/codes"
)

// Class is one error class. The numbering is stable (the transport SDK
// has used it since its first version).
type Class uint8

const (
	Unknown            Class = 0
	InvalidArgument    Class = 1
	NotFound           Class = 2
	AlreadyExists      Class = 3
	Unavailable        Class = 4
	FailedPrecondition Class = 5
	ResourceExhausted  Class = 6
	Unimplemented      Class = 7
	Internal           Class = 8
)

// Classes lists every class, in numeric order.
var Classes = []Class{Unknown, InvalidArgument, NotFound, AlreadyExists, Unavailable,
	FailedPrecondition, ResourceExhausted, Unimplemented, Internal}

type classInfo struct {
	name string // stable, for logs, metrics and wire fields
	text string // what Error says
	code codes.Code
}

var info = [...]classInfo{
	Unknown:            {"unknown", "unknown", codes.Unknown},
	InvalidArgument:    {"invalid-argument", "invalid argument", codes.InvalidArgument},
	NotFound:           {"not-found", "not found", codes.NotFound},
	AlreadyExists:      {"already-exists", "already exists", codes.AlreadyExists},
	Unavailable:        {"unavailable", "unavailable", codes.Unavailable},
	FailedPrecondition: {"failed-precondition", "failed precondition", codes.FailedPrecondition},
	ResourceExhausted:  {"resource-exhausted", "resource exhausted", codes.ResourceExhausted},
	Unimplemented:      {"unimplemented", "unimplemented", codes.Unimplemented},
	Internal:           {"internal", "internal", codes.Internal},
}

func (c Class) known() bool { return int(c) < len(info) }

// String is the class's stable name ("invalid-argument").
func (c Class) String() string {
	if c.known() {
		return info[c].name
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// Error makes a Class usable as a sentinel: fmt.Errorf("%w: ...", NotFound).
func (c Class) Error() string {
	if c.known() {
		return info[c].text
	}
	return c.String()
}

// Code is the class's gRPC code.
func (c Class) Code() codes.Code {
	if c.known() {
		return info[c].code
	}
	return codes.Unknown
}

// MarshalText writes the class's name (JSON fields carry names, not numbers).
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads a class name; an unknown one reads as Unknown.
func (c *Class) UnmarshalText(b []byte) error {
	*c, _ = Parse(string(b))
	return nil
}

// Parse maps a class name (String) back to its class.
func Parse(name string) (Class, bool) {
	for _, c := range Classes {
		if info[c].name == name {
			return c, true
		}
	}
	return Unknown, false
}

// FromCode maps a gRPC code back to a class. Codes without a class of their
// own fold conservatively: deadline, cancellation and abort look like a peer
// that could not answer (Unavailable: the caller must not infer that nothing
// happened), OutOfRange is an invalid argument, PermissionDenied and
// Unauthenticated are preconditions, DataLoss is internal.
func FromCode(code codes.Code) Class {
	switch code {
	case codes.OK:
		return Unknown
	case codes.InvalidArgument, codes.OutOfRange:
		return InvalidArgument
	case codes.NotFound:
		return NotFound
	case codes.AlreadyExists:
		return AlreadyExists
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return Unavailable
	case codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated:
		return FailedPrecondition
	case codes.ResourceExhausted:
		return ResourceExhausted
	case codes.Unimplemented:
		return Unimplemented
	case codes.Internal, codes.DataLoss:
		return Internal
	}
	return Unknown
}
