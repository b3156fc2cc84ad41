package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassesRoundTripThroughGRPC(t *testing.T) {
	for _, c := range Classes {
		if got := FromCode(c.Code()); got != c {
			t.Errorf("%v -> %v -> %v", c, c.Code(), got)
		}
		if p, ok := Parse(c.String()); !ok || p != c {
			t.Errorf("Parse(%q) = %v, %v", c.String(), p, ok)
		}
		for _, err := range []error{Errorf(c, "boom"), fmt.Errorf("%w: boom", c)} {
			if got := ClassOf(FromGRPC(ToGRPC(err))); got != c {
				t.Errorf("%v did not survive the wire: %v", c, got)
			}
		}
	}
}

// Sentinels, wrapped sentinels, *Error values and gRPC status errors all
// answer errors.Is / the Is... helpers by class.
func TestIsByClass(t *testing.T) {
	wrapped := fmt.Errorf("admit: %w", Errorf(ResourceExhausted, "pool full"))
	sentinel := fmt.Errorf("%w: slot 3", NotFound)
	switch {
	case !errors.Is(wrapped, ResourceExhausted), !IsResourceExhausted(wrapped), IsNotFound(wrapped):
		t.Error("wrapped *Error")
	case !errors.Is(sentinel, NotFound), !IsNotFound(sentinel), ClassOf(sentinel) != NotFound:
		t.Error("wrapped sentinel")
	case !errors.Is(wrapped, &Error{Class: ResourceExhausted}), errors.Is(wrapped, &Error{Class: ResourceExhausted, Msg: "x"}):
		t.Error("*Error target")
	case !IsUnavailable(status.Error(codes.DeadlineExceeded, "slow")), !IsUnavailable(context.Canceled):
		t.Error("timeouts must read as unavailable")
	case ClassOf(errors.New("plain")) != Unknown, Is(nil, Unknown):
		t.Error("unclassified")
	}
	if got := ClassOf(FromGRPC(ToGRPC(errors.New("oops")))); got != Internal {
		t.Errorf("an unclassified error crossed as %v, want internal", got)
	}
}

func TestEveryGRPCCodeHasAClass(t *testing.T) {
	for code := codes.OK; code <= codes.Unauthenticated; code++ {
		if c := FromCode(code); code != codes.OK && code != codes.Unknown && c == Unknown {
			t.Errorf("code %v maps to no class", code)
		}
	}
}
