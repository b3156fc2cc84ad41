package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// closeBound is how long Close may take with a peer that does not read:
// far more than tearing down a few sockets needs. A liveness check, not a
// speed target.
const closeBound = 4 * time.Second

// closeWithin closes tr and fails the test if Close does not return within
// closeBound.
func closeWithin(t *testing.T, tr sdk.Transport) {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- tr.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
		t.Logf("Close returned after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(closeBound):
		t.Fatalf("Close did not return within %v with a stalled receiver", closeBound)
	}
}

// Close with batches written to a live receiver that stopped reading
// (SIGSTOP) and more queued behind them returns promptly, and completes
// every pending batch exactly once, the written ones InDoubt.
func TestCloseWithStalledReceiver(t *testing.T) {
	w := newStalledWrite(t, Config{})
	ctx := context.Background()
	k := w.key
	// Fill the socket buffers so that the writer blocks in a write.
	var more []sdk.BatchID
	for i := 0; i < 8; i++ {
		id := w.e.NewBatchID()
		if err := w.s.Post(ctx, w.e.Write(id, k, 0, 0, 512<<10)); err != nil {
			t.Fatal(err)
		}
		more = append(more, id)
	}
	time.Sleep(200 * time.Millisecond)
	closeWithin(t, w.s)
	if !w.e.StreamEnded() {
		t.Fatal("Close returned but the completion stream did not end")
	}
	if n := w.e.Count(w.id); n != 1 {
		t.Fatalf("the stalled batch has %d completions, want 1", n)
	}
	if c, _ := w.e.Wait(w.id); c.Status != sdk.InDoubt {
		t.Fatalf("the stalled batch: %+v, want InDoubt", c)
	}
	for _, id := range more {
		if n := w.e.Count(id); n != 1 {
			t.Fatalf("batch %d has %d completions, want 1", id, n)
		}
		if c, _ := w.e.Wait(id); c.Status == sdk.Succeeded {
			t.Fatalf("batch %d succeeded although the receiver is stopped: %+v", id, c)
		}
	}
}

// Close while the first connection to a live receiver that does not answer
// (stopped before its handshake) is still being opened returns promptly;
// the batch waiting for it never left and fails definitely, once.
func TestCloseWhileDialingStalledReceiver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newTCP(t, Config{})
	rp := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: s, Receiver: rp.Transport()})
	if err != nil {
		t.Fatal(err)
	}
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Length: sdktest.EnvSize})
	if err != nil {
		t.Fatal(err)
	}
	stopProcess(t, rp.Pid())
	id := e.NewBatchID()
	if err := s.Post(ctx, e.Write(id, k, 0, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the dial is under way
	closeWithin(t, s)
	c, err := e.Wait(id)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.Count(id); n != 1 || c.Status != sdk.FailedDefinite {
		t.Fatalf("batch: %d completions, first %+v; want one FailedDefinite", n, c)
	}
}
