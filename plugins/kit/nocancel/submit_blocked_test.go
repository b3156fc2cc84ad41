package nocancel

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// blockSubmit makes the backend's Submit block until the returned func is
// called; a failing test opens it too (before the transports close), so the
// old code, whose poller waits on the lock the blocked Post holds, fails
// instead of hanging.
func (p *pair) blockSubmit(t *testing.T) func() {
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	p.be.gate = gate
	t.Cleanup(open)
	return open
}

// postAsync posts a one-op batch without waiting for Post to return.
func (p *pair) postAsync(id sdk.BatchID) <-chan error {
	b := sdk.Batch{ID: id, Peer: p.peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: p.src, RemoteKey: p.key, Length: 4096}}}
	done := make(chan error, 1)
	go func() { done <- p.ini.Post(context.Background(), b) }()
	return done
}

// A submit call that blocks (Mooncake's TCP transport connects inside it)
// neither stops the poller nor locks the transport: the batch is reported
// InDoubt at its deadline, Post returns then (accepted) while the call
// still blocks, Quiesce answers meanwhile, and once the call returns the
// job is polled and freed.
func TestSubmitBlockedReportsInDoubtAtTheDeadline(t *testing.T) {
	p := newPair(t, "v2", 20*time.Millisecond)
	open := p.blockSubmit(t)
	posted := p.postAsync(1)
	c, ok := p.completion(t, 10*time.Second)
	if !ok || c.Status != sdk.InDoubt {
		t.Fatalf("completion %+v ok=%v while the submit call blocked, want InDoubt", c, ok)
	}
	select {
	case err := <-posted:
		if err != nil {
			t.Fatalf("Post after its InDoubt went out: %v", err)
		}
	case <-time.After(30 * time.Second): // a bound on a wait, not a speed target
		t.Fatal("Post still blocked in the library's submit call after the batch was reported InDoubt")
	}
	if _, err := p.ini.Quiesce(context.Background(), p.peer, []sdk.BatchID{1}); !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("Quiesce while the submit call blocked: %v, want Unavailable", err)
	}
	open()
	eventually(t, "the submit call returned its job", func() bool { return p.be.hasJob(1) })
	p.be.set(1, 0, Completed)
	eventually(t, "job freed once its task is terminal", func() bool { return p.be.isFreed(1) })
	if _, ok := p.completion(t, 50*time.Millisecond); ok {
		t.Fatal("a second completion")
	}
}

// A blocked submit call that finally refuses (nothing sent) after the
// batch's InDoubt went out: that InDoubt stays its one completion, Post
// returns nil, and the source is released.
func TestSubmitRefusedAfterItsInDoubt(t *testing.T) {
	p := newPair(t, "v2", 20*time.Millisecond)
	open := p.blockSubmit(t)
	p.be.refuse = errdefs.Errorf(errdefs.ResourceExhausted, "refused")
	posted := p.postAsync(1)
	if c, ok := p.completion(t, 10*time.Second); !ok || c.Status != sdk.InDoubt {
		t.Fatalf("completion %+v ok=%v, want InDoubt", c, ok)
	}
	open()
	if err := <-posted; err != nil {
		t.Fatalf("Post returned %v after the batch's completion went out (two outcomes for one batch)", err)
	}
	if _, ok := p.completion(t, 50*time.Millisecond); ok {
		t.Fatal("a second completion")
	}
	// Post returned at the InDoubt; the refused call is settled after it.
	eventually(t, "source released once the library refused the batch", func() bool {
		return p.ini.DeregisterMemory(context.Background(), p.src) == nil
	})
}

// An open of the peer's segment that blocks (Mooncake's openSegment
// handshakes with the peer inside the call) must not hold Post past the
// report deadline: Post refuses, Unavailable, nothing submitted, no
// completion; once the library answers again the next Post goes through.
func TestOpenBlockedRefusesPostAtTheDeadline(t *testing.T) {
	p := newPair(t, "v2", 20*time.Millisecond)
	gate := make(chan struct{})
	p.be.openGate = gate // the key is resolved, and the segment opened, at its first Post
	posted := p.postAsync(1)
	select {
	case err := <-posted:
		if !errdefs.Is(err, errdefs.Unavailable) {
			t.Fatalf("Post while the library's open blocked: %v, want Unavailable", err)
		}
	case <-time.After(30 * time.Second): // a bound on a wait, not a speed target
		close(gate)
		t.Fatal("Post still blocked in the library's open call past the report deadline")
	}
	if c, ok := p.completion(t, 50*time.Millisecond); ok {
		t.Fatalf("a completion %+v for a batch Post refused", c)
	}
	close(gate)
	if err := <-p.postAsync(2); err != nil {
		t.Fatalf("Post once the library answers again: %v", err)
	}
}
