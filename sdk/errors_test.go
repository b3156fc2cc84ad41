package sdk

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassesRoundTripThroughGRPC(t *testing.T) {
	for c := ClassUnknown; c <= ClassInternal; c++ {
		if got := CodeToClass(c.Code()); got != c && c != ClassUnknown {
			t.Errorf("%v -> %v -> %v", c, c.Code(), got)
		}
		err := fromStatusError(toStatusError(Errorf(c, "boom %d", c)))
		if ClassOf(err) != c {
			t.Errorf("%v did not survive the wire: %v", c, err)
		}
	}
}

func TestEveryGRPCCodeHasAClass(t *testing.T) {
	for code := codes.OK; code <= codes.Unauthenticated; code++ {
		cl := CodeToClass(code)
		if code != codes.OK && code != codes.Unknown && cl == ClassUnknown {
			t.Errorf("code %v maps to no class", code)
		}
	}
	// Timeouts and cancellations are never evidence that nothing happened.
	for _, code := range []codes.Code{codes.DeadlineExceeded, codes.Canceled, codes.Aborted} {
		if CodeToClass(code) != ClassUnavailable {
			t.Errorf("%v must map to unavailable", code)
		}
	}
}

func TestClassOf(t *testing.T) {
	wrapped := fmt.Errorf("ctx: %w", Errorf(ClassNotFound, "x"))
	cases := []struct {
		err  error
		want Class
	}{
		{nil, ClassUnknown},
		{wrapped, ClassNotFound},
		{context.DeadlineExceeded, ClassUnavailable},
		{status.Error(codes.ResourceExhausted, "full"), ClassResourceExhausted},
		{errors.New("plain"), ClassUnknown},
	}
	for _, c := range cases {
		if got := ClassOf(c.err); got != c.want {
			t.Errorf("ClassOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if !errors.Is(wrapped, &Error{Class: ClassNotFound}) {
		t.Error("errors.Is by class failed")
	}
	// An unclassified plugin error is a plugin bug: it crosses as Internal.
	if got := ClassOf(fromStatusError(toStatusError(errors.New("oops")))); got != ClassInternal {
		t.Errorf("unclassified error crossed as %v", got)
	}
}

func TestStatusOnTheWireIsNeverOptimistic(t *testing.T) {
	if statusFromPB(0) != InDoubt || statusFromPB(99) != InDoubt {
		t.Fatal("an unreadable status must read as InDoubt")
	}
	for _, s := range []Status{Succeeded, FailedDefinite, InDoubt} {
		if statusFromPB(statusToPB(s)) != s {
			t.Errorf("%v does not round-trip", s)
		}
	}
}
