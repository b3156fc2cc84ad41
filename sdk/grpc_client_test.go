package sdk

import (
	"context"
	"io"
	"testing"
	"time"

	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deadPost is a plugin killed during Post: the call fails in the gRPC
// machinery (no classified trailer), after running before, if set.
type deadPost struct {
	pb.TransportClient
	before func()
}

func (d deadPost) Post(context.Context, *pb.PostRequest, ...grpc.CallOption) (*pb.PostResponse, error) {
	if d.before != nil {
		d.before()
	}
	return nil, status.Error(codes.Unavailable, "error reading from server: EOF")
}

func testRemote(rpc pb.TransportClient) *remote {
	return &remote{rpc: rpc, outstanding: map[BatchID]struct{}{}, inDoubt: map[BatchID]struct{}{},
		out: make(chan Completion, 8), events: make(chan Event, 8)}
}

// The kill breaks Post and the completion stream at once; whichever the host
// handles first, the batch Post reports accepted gets exactly one completion.
func TestPostOutcomeUnknownRacingLose(t *testing.T) {
	t.Run("lose-between-claim-and-send", func(t *testing.T) {
		r := testRemote(deadPost{})
		lost := make(chan struct{})
		postUnknownHook = func(r *remote) {
			go func() { r.lose(io.EOF); close(lost) }()
			for r.gone() == nil {
				time.Sleep(time.Millisecond)
			}
			// Give lose the chance to close out before our send.
			select {
			case <-lost:
			case <-time.After(200 * time.Millisecond):
			}
		}
		defer func() { postUnknownHook = nil }()
		checkOne(t, r, 7)
		<-lost
	})
	t.Run("lose-before-claim", func(t *testing.T) {
		var r *remote
		r = testRemote(deadPost{before: func() { r.lose(io.EOF) }})
		checkOne(t, r, 8)
	})
}

// checkOne posts id on r (whose plugin is lost by then) and checks that it
// is accepted and completed InDoubt exactly once before out closes.
func checkOne(t *testing.T, r *remote, id BatchID) {
	t.Helper()
	if err := r.Post(context.Background(), Batch{ID: id}); err != nil {
		t.Fatalf("Post: %v (the outcome was unknown: want accepted)", err)
	}
	var got []Completion
	for c := range r.out {
		got = append(got, c)
	}
	if len(got) != 1 || got[0].Batch != id || got[0].Status != InDoubt {
		t.Fatalf("completions %+v, want exactly one InDoubt for batch %d", got, id)
	}
}
