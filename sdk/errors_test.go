package sdk

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfence/kvfence/errdefs"
)

func TestClassesRoundTripThroughGRPC(t *testing.T) {
	for c := errdefs.Unknown; c <= errdefs.Internal; c++ {
		if got := errdefs.FromCode(c.Code()); got != c && c != errdefs.Unknown {
			t.Errorf("%v -> %v -> %v", c, c.Code(), got)
		}
		err := fromStatusError(toStatusError(errdefs.Errorf(c, "boom %d", c)))
		if errdefs.ClassOf(err) != c {
			t.Errorf("%v did not survive the wire: %v", c, err)
		}
	}
}

func TestEveryGRPCCodeHasAClass(t *testing.T) {
	for code := codes.OK; code <= codes.Unauthenticated; code++ {
		cl := errdefs.FromCode(code)
		if code != codes.OK && code != codes.Unknown && cl == errdefs.Unknown {
			t.Errorf("code %v maps to no class", code)
		}
	}
	// Timeouts and cancellations are never evidence that nothing happened.
	for _, code := range []codes.Code{codes.DeadlineExceeded, codes.Canceled, codes.Aborted} {
		if errdefs.FromCode(code) != errdefs.Unavailable {
			t.Errorf("%v must map to unavailable", code)
		}
	}
}

func TestClassOf(t *testing.T) {
	wrapped := fmt.Errorf("ctx: %w", errdefs.Errorf(errdefs.NotFound, "x"))
	cases := []struct {
		err  error
		want errdefs.Class
	}{
		{nil, errdefs.Unknown},
		{wrapped, errdefs.NotFound},
		{context.DeadlineExceeded, errdefs.Unavailable},
		{status.Error(codes.ResourceExhausted, "full"), errdefs.ResourceExhausted},
		{errors.New("plain"), errdefs.Unknown},
	}
	for _, c := range cases {
		if got := errdefs.ClassOf(c.err); got != c.want {
			t.Errorf("errdefs.ClassOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if !errors.Is(wrapped, &errdefs.Error{Class: errdefs.NotFound}) {
		t.Error("errors.Is by class failed")
	}
	// An unclassified plugin error is a plugin bug: it crosses as Internal.
	if got := errdefs.ClassOf(fromStatusError(toStatusError(errors.New("oops")))); got != errdefs.Internal {
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
