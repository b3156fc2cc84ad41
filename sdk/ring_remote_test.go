package sdk

import (
	"context"
	"net/rpc"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk/internal/ring"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
)

// heldTransport accepts every non-empty batch and completes it only when
// told (complete), or InDoubt on Close: a plugin with work in flight.
type heldTransport struct {
	mu      sync.Mutex
	pending map[BatchID]bool
	seen    map[BatchID]bool
	out     chan Completion
	closed  bool
}

func newHeldTransport() *heldTransport {
	return &heldTransport{pending: map[BatchID]bool{}, seen: map[BatchID]bool{}, out: make(chan Completion, 64)}
}

func (h *heldTransport) Info(context.Context) (Info, error) {
	return Info{Name: "held", ProtocolVersion: ProtocolVersion, Capabilities: Capabilities{MaxBatch: 8, MaxOpBytes: 1 << 20}}, nil
}
func (h *heldTransport) RegisterMemory(context.Context, MemoryDesc) (RegionID, error) { return 1, nil }
func (h *heldTransport) DeregisterMemory(context.Context, RegionID) error             { return nil }
func (h *heldTransport) LocalEndpoint(context.Context) (Endpoint, error)              { return Endpoint{}, nil }
func (h *heldTransport) Connect(context.Context, Endpoint) (PeerID, error)            { return "p", nil }
func (h *heldTransport) Disconnect(context.Context, PeerID) error                     { return nil }
func (h *heldTransport) Completions() <-chan Completion                               { return h.out }
func (h *heldTransport) Quiesce(context.Context, PeerID, []BatchID) (QuiesceResult, error) {
	return QuiesceResult{}, errdefs.Errorf(errdefs.Unavailable, "no evidence")
}

func (h *heldTransport) Post(_ context.Context, b Batch) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return errdefs.Errorf(errdefs.Unavailable, "closed")
	case len(b.Ops) == 0:
		return errdefs.Errorf(errdefs.InvalidArgument, "empty batch")
	case h.seen[b.ID]:
		return errdefs.Errorf(errdefs.AlreadyExists, "batch %d reused", b.ID)
	}
	h.seen[b.ID], h.pending[b.ID] = true, true
	return nil
}

func (h *heldTransport) complete(id BatchID, s Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending[id] {
		delete(h.pending, id)
		h.out <- Completion{Batch: id, Status: s, Class: errdefs.Unknown}
	}
}

func (h *heldTransport) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		for id := range h.pending {
			h.out <- Completion{Batch: id, Status: InDoubt, Class: errdefs.Unavailable, Detail: "closed"}
		}
		close(h.out)
	}
	return nil
}

// oldPlugin serves kvfence.transport.v1 without the rings, as a plugin
// built with an SDK from before them does.
type oldPlugin struct{ impl Transport }

func (p *oldPlugin) Server(*plugin.MuxBroker) (interface{}, error)              { return nil, nil }
func (p *oldPlugin) Client(*plugin.MuxBroker, *rpc.Client) (interface{}, error) { return nil, nil }
func (p *oldPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterTransportServer(s, newGRPCServer(p.impl))
	return nil
}
func (p *oldPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return c, nil
}

// v1RingsPlugin is a plugin from before the pipe doorbells: its Attach
// takes only kvfence-rings/v1 with an 8-byte capacity, and refuses
// anything else as InvalidArgument, as that SDK did.
type v1RingsPlugin struct{ oldPlugin }

type v1Attacher struct{ *grpcServer }

func (a v1Attacher) attach(ctx context.Context, req *pb.Endpoint) (*pb.Endpoint, error) {
	if req.GetTransport() != ringsDataPath || len(req.GetOpaque()) != 8 {
		return nil, fail(ctx, errdefs.Errorf(errdefs.InvalidArgument, "rings: unknown data path %q", req.GetTransport()))
	}
	return a.grpcServer.attach(ctx, req)
}

func (p *v1RingsPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	srv := newGRPCServer(p.impl)
	pb.RegisterTransportServer(s, srv)
	s.RegisterService(&ringsServiceDesc, v1Attacher{srv})
	return nil
}

// connectTest serves impl in process with set (nil: this SDK's) and
// returns the host's remote.
func connectTest(t *testing.T, impl Transport, set plugin.Plugin) *remote {
	t.Helper()
	if set == nil {
		set = &grpcPlugin{impl: impl}
	}
	t.Setenv("TMPDIR", "/tmp")
	client, _ := plugin.TestPluginGRPCConn(t, false, plugin.PluginSet{pluginName: set})
	raw, err := client.Dispense(pluginName)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := newRemote(ctx, raw.(*grpc.ClientConn), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = client.Close() })
	return r
}

func oneOp() []Op { return []Op{{Kind: OpWrite, LocalRegion: 1, RemoteKey: 1, Length: 1}} }

// The rings are the default when both sides have them, with pipe
// doorbells (v2); a plugin that knows only v1 rings, or KVFENCE_RINGS=v1,
// gets the futex doorbells; an old plugin, or KVFENCE_RINGS=off, gets
// gRPC Post. Either way: refusals keep their class, accepted batches get
// exactly one completion, and Close turns what is pending into InDoubt.
func TestDataPathNegotiation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		plugin    string // "": this SDK's; "old": no rings; "v1": rings without pipes
		env       string
		wantP     DataPath
		wantPipes bool
	}{
		{"both-sides-rings", "", "", DataPathRings, true},
		{"v1-rings-plugin", "v1", "", DataPathRings, false},
		{"host-rings-v1", "", "v1", DataPathRings, false},
		{"old-plugin", "old", "", DataPathGRPC, false},
		{"host-rings-off", "", "off", DataPathGRPC, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envRings, tc.env)
			impl := newHeldTransport()
			var set plugin.Plugin
			switch tc.plugin {
			case "old":
				set = &oldPlugin{impl: impl}
			case "v1":
				set = &v1RingsPlugin{oldPlugin{impl: impl}}
			}
			r := connectTest(t, impl, set)
			if got := r.dataPath(); got != tc.wantP {
				t.Fatalf("data path %s, want %s", got, tc.wantP)
			}
			if r.rings != nil && (r.rings.sub.Piped() != tc.wantPipes || r.rings.comp.Piped() != tc.wantPipes) {
				t.Fatalf("pipe doorbells %v/%v, want %v", r.rings.sub.Piped(), r.rings.comp.Piped(), tc.wantPipes)
			}
			ctx := context.Background()
			if err := r.Post(ctx, Batch{ID: 1}); !errdefs.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("empty batch: %v, want invalid argument", err)
			}
			for id := BatchID(2); id <= 4; id++ {
				if err := r.Post(ctx, Batch{ID: id, Ops: oneOp()}); err != nil {
					t.Fatalf("Post %d: %v", id, err)
				}
			}
			impl.complete(2, Succeeded)
			if c := <-r.Completions(); c.Batch != 2 || c.Status != Succeeded {
				t.Fatalf("completion %+v, want batch 2 Succeeded", c)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			got := map[BatchID]Status{}
			for c := range r.Completions() {
				if _, dup := got[c.Batch]; dup {
					t.Fatalf("second completion for %d", c.Batch)
				}
				got[c.Batch] = c.Status
			}
			if len(got) != 2 || got[3] != InDoubt || got[4] != InDoubt {
				t.Fatalf("after Close: %v, want 3 and 4 InDoubt", got)
			}
		})
	}
}

// A plugin that writes garbage into the completion ring is dropped: a
// protocol violation is reported, everything it owed completes InDoubt
// exactly once, and the host stays up and refuses further Posts.
func TestRingsCorruptPluginIsDropped(t *testing.T) {
	at := func(data []byte, pos, capacity uint64) []byte { return data[pos&(capacity-1):] }
	for name, corrupt := range map[string]func(data []byte, pos, capacity uint64) (tail uint64){
		"tail-beyond-capacity": func(_ []byte, pos, capacity uint64) uint64 { return pos + capacity + 16 },
		"huge-record": func(data []byte, pos, capacity uint64) uint64 {
			ring.PutRecordHeader(at(data, pos, capacity), 0xfffffff0, ring.RecCompletion, 0)
			return pos + 64
		},
		"unknown-kind": func(data []byte, pos, capacity uint64) uint64 {
			ring.PutRecordHeader(at(data, pos, capacity), 0, 77, 0)
			return pos + ring.HeaderSize
		},
		"garbage-completion": func(data []byte, pos, capacity uint64) uint64 {
			ring.PutRecordHeader(at(data, pos, capacity), 8, ring.RecCompletion, 0)
			copy(at(data, pos, capacity)[ring.HeaderSize:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			return pos + 32
		},
		"verdict-never-asked": func(data []byte, pos, capacity uint64) uint64 {
			ring.PutRecordHeader(at(data, pos, capacity), 0, ring.RecPostOK, 1<<40)
			return pos + ring.HeaderSize
		},
	} {
		t.Run(name, func(t *testing.T) {
			impl := newHeldTransport()
			r := connectTest(t, impl, nil)
			if r.rings == nil {
				t.Fatal("rings not negotiated")
			}
			ctx := context.Background()
			for id := BatchID(1); id <= 3; id++ {
				if err := r.Post(ctx, Batch{ID: id, Ops: oneOp()}); err != nil {
					t.Fatal(err)
				}
			}
			// Play the plugin: its view of the completion ring is a second
			// mapping of the same pages, with the producer's position.
			// A mapping of its own, as a plugin has: the host unmaps its view
			// when it drops the plugin, which may happen as soon as the
			// corrupt record is visible.
			h := r.rings
			m, err := MapMemory(h.shm.Desc())
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			plug := ring.Completion(m.Bytes(), h.comp.Capacity())
			plug.Forge(corrupt)
			plug.Interrupt()
			got := map[BatchID]Status{}
			timeout := time.After(10 * time.Second)
			for done := false; !done; {
				select {
				case c, ok := <-r.Completions():
					if !ok {
						done = true
						break
					}
					if _, dup := got[c.Batch]; dup {
						t.Fatalf("second completion for %d", c.Batch)
					}
					got[c.Batch] = c.Status
				case <-timeout:
					t.Fatal("the host did not drop the plugin")
				}
			}
			if len(got) != 3 || got[1] != InDoubt || got[2] != InDoubt || got[3] != InDoubt {
				t.Fatalf("completions %v, want 1..3 InDoubt", got)
			}
			if r.violations.Load() == 0 {
				t.Fatal("no protocol violation counted")
			}
			if err := r.Post(ctx, Batch{ID: 9, Ops: oneOp()}); !errdefs.Is(err, errdefs.Unavailable) {
				t.Fatalf("Post after the drop: %v, want unavailable", err)
			}
		})
	}
}

// A caller that posts without reading completions must not stall its own
// Posts: their verdicts queue behind completions in the ring, so the
// host never blocks its ring consumer on a full Completions channel.
func TestRingsPostDoesNotWaitForCompletionReaders(t *testing.T) {
	impl := newHeldTransport()
	impl.out = make(chan Completion, completionBuffer+100)
	r := connectTest(t, impl, nil)
	if r.rings == nil {
		t.Fatal("rings not negotiated")
	}
	const n = completionBuffer + 64
	done := make(chan error, 1)
	go func() {
		for id := BatchID(1); id <= n; id++ {
			if err := r.Post(context.Background(), Batch{ID: id, Ops: oneOp()}); err != nil {
				done <- err
				return
			}
			impl.complete(id, Succeeded)
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Post stalled behind unread completions")
	}
	for id := BatchID(1); id <= n; id++ {
		if c := <-r.Completions(); c.Batch != id || c.Status != Succeeded {
			t.Fatalf("completion %+v, want batch %d Succeeded (in order)", c, id)
		}
	}
}
