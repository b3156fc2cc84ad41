package sdk

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk/internal/ring"
)

// With AsyncPost, Post returns once the batch is in the ring, and the
// plugin's refusal becomes that batch's one completion: FailedDefinite
// with the refusal's class. Accepted batches complete as usual, and Close
// makes what is still pending InDoubt — a refused batch is never
// completed a second time.
func TestAsyncPostRefusalIsTheCompletion(t *testing.T) {
	impl := newHeldTransport()
	r := connectTest(t, impl, nil)
	r.setAsyncPost(true)
	if r.rings == nil || !r.rings.async {
		t.Fatal("async Post not in effect on the rings")
	}
	ctx := context.Background()
	if err := r.Post(ctx, Batch{ID: 1}); err != nil { // empty: the plugin refuses it
		t.Fatalf("async Post of a batch the plugin refuses: %v, want nil (the refusal is its completion)", err)
	}
	for id := BatchID(2); id <= 4; id++ {
		if err := r.Post(ctx, Batch{ID: id, Ops: oneOp()}); err != nil {
			t.Fatalf("Post %d: %v", id, err)
		}
	}
	if err := r.Post(ctx, Batch{ID: 2, Ops: oneOp()}); !errdefs.Is(err, errdefs.AlreadyExists) {
		t.Fatalf("reposting outstanding batch 2: %v, want already exists (checked by the host)", err)
	}
	c := nextCompletion(t, r)
	if c.Batch != 1 || c.Status != FailedDefinite || c.Class != errdefs.InvalidArgument {
		t.Fatalf("first completion %+v, want batch 1 FailedDefinite invalid-argument", c)
	}
	for !impl.has(4) { // async: the plugin takes the batches after Post returned
		time.Sleep(time.Millisecond)
	}
	impl.complete(2, Succeeded)
	if c := nextCompletion(t, r); c.Batch != 2 || c.Status != Succeeded {
		t.Fatalf("completion %+v, want batch 2 Succeeded", c)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[BatchID]Status{}
	for c := range r.Completions() {
		if _, dup := got[c.Batch]; dup || c.Batch < 3 {
			t.Fatalf("second completion for %d: %+v", c.Batch, c)
		}
		got[c.Batch] = c.Status
	}
	if len(got) != 2 || got[3] != InDoubt || got[4] != InDoubt {
		t.Fatalf("after Close: %v, want 3 and 4 InDoubt", got)
	}
}

// Over gRPC there is no ring to return early from: the contract stays
// synchronous even when AsyncPost is asked for.
func TestAsyncPostNeedsTheRings(t *testing.T) {
	t.Setenv(envRings, "off")
	r := connectTest(t, newHeldTransport(), nil)
	r.setAsyncPost(true)
	if err := r.Post(context.Background(), Batch{ID: 1}); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("empty batch over gRPC: %v, want the refusal from Post", err)
	}
}

func nextCompletion(t *testing.T, r *remote) Completion {
	t.Helper()
	select {
	case c := <-r.Completions():
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no completion within 10s")
		return Completion{}
	}
}

func (h *heldTransport) has(id BatchID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[id]
}

// KVFENCE_ASYNC_POST amends the host's choice (asynchronous unless it
// asked for OpenOptions.SyncPost) for every host: off means synchronous
// even where the host took the default, on asynchronous even where it
// asked for SyncPost; a value other than on/off is refused before any
// plugin starts, so a typo never silently picks a contract.
func TestAsyncPostFromEnv(t *testing.T) {
	for _, c := range []struct {
		env       string
		opt, want bool
		bad       bool
	}{
		{"", false, false, false}, {"", true, true, false},
		{"on", false, true, false}, {"off", true, false, false},
		{"off", false, false, false}, {"yes", false, false, true},
	} {
		t.Setenv(envAsyncPost, c.env)
		got, err := AsyncPostFromEnv(c.opt)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("%s=%q opt=%v: %v, %v; want %v (refused %v)", envAsyncPost, c.env, c.opt, got, err, c.want, c.bad)
		}
	}
	t.Setenv(envAsyncPost, "yes")
	if _, err := Open("/nonexistent/plugin", OpenOptions{}); !errdefs.Is(err, errdefs.InvalidArgument) {
		t.Fatalf("Open with %s=yes: %v, want invalid argument", envAsyncPost, err)
	}
}

// With asynchronous Post nobody waits for an accepted Post's verdict, so
// the plugin publishes it without waking the host; a refusal (the batch's
// completion) still wakes it, and so does every verdict for a host that
// waits (SyncPost). A plugin that rang for every accept would wake the
// host once per batch for nothing.
func TestAsyncAcceptsWakeNobody(t *testing.T) {
	for _, c := range []struct {
		name              string
		flags             uint32
		refused           bool
		wantWake, wantRec bool
	}{
		{"async accept", ring.QuietAccepts, false, false, true},
		{"async refusal", ring.QuietAccepts, true, true, true},
		{"sync accept", 0, false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			const capacity = ring.MinCapacity
			mem := make([]byte, ring.LayoutSize(capacity))
			ring.InitLayout(mem, capacity)
			ring.HostFlags(mem).Store(c.flags)
			host := ring.Completion(mem, capacity)
			p := &pluginRings{comp: ring.Completion(mem, capacity), flags: ring.HostFlags(mem), stop: make(chan struct{})}
			var err error
			if c.refused {
				err = errdefs.Errorf(errdefs.InvalidArgument, "no")
			}
			host.AnnounceSleep()
			p.verdict(7, err, true)
			if woke := p.comp.Wakes() == 1; woke != c.wantWake {
				t.Errorf("host woken: %v, want %v", woke, c.wantWake)
			}
			if _, seq, _, _, ok, _ := host.Next(nil); ok != c.wantRec || seq != 7 {
				t.Errorf("verdict record: %v (seq %d), want it published", ok, seq)
			}
		})
	}
}
