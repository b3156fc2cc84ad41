package sdk

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/go-plugin"
	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
)

// keyTable is a plugin's transport that grants keys over region 1 only and
// revokes known keys (NotFound otherwise): a plain Granter, no KeyBatcher.
type keyTable struct {
	*heldTransport
	mu      sync.Mutex
	next    Key
	live    map[Key]bool
	grants  atomic.Int64 // single Grant calls the transport saw
	revokes atomic.Int64
}

func newKeyTable() *keyTable {
	return &keyTable{heldTransport: newHeldTransport(), live: map[Key]bool{}}
}

func (k *keyTable) Grant(_ context.Context, w Window) (Key, error) {
	k.grants.Add(1)
	if w.Region != 1 {
		return 0, errdefs.Errorf(errdefs.NotFound, "Grant: region %d", w.Region)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next++
	k.live[k.next] = true
	return k.next, nil
}

func (k *keyTable) Revoke(_ context.Context, key Key) (RevokeResult, error) {
	k.revokes.Add(1)
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.live[key]; !ok {
		return RevokeResult{}, errdefs.Errorf(errdefs.NotFound, "Revoke: unknown key")
	}
	k.live[key] = false
	return RevokeResult{WritesApplied: 1}, nil
}

// rpcCounter counts the key RPCs a host makes.
type rpcCounter struct {
	pb.TransportClient
	single, batch atomic.Int64
}

func (c *rpcCounter) Grant(ctx context.Context, r *pb.GrantRequest, o ...grpc.CallOption) (*pb.GrantResponse, error) {
	c.single.Add(1)
	return c.TransportClient.Grant(ctx, r, o...)
}
func (c *rpcCounter) Revoke(ctx context.Context, r *pb.RevokeRequest, o ...grpc.CallOption) (*pb.RevokeResponse, error) {
	c.single.Add(1)
	return c.TransportClient.Revoke(ctx, r, o...)
}
func (c *rpcCounter) GrantMany(ctx context.Context, r *pb.GrantManyRequest, o ...grpc.CallOption) (*pb.GrantManyResponse, error) {
	c.batch.Add(1)
	return c.TransportClient.GrantMany(ctx, r, o...)
}
func (c *rpcCounter) RevokeMany(ctx context.Context, r *pb.RevokeManyRequest, o ...grpc.CallOption) (*pb.RevokeManyResponse, error) {
	c.batch.Add(1)
	return c.TransportClient.RevokeMany(ctx, r, o...)
}

// preBatchServer serves kvfence.transport.v1 as a plugin built with an SDK
// from before batch keys: no batch_keys in Info, the batch RPCs unknown.
type preBatchServer struct{ *grpcServer }

func (s preBatchServer) Info(ctx context.Context, r *pb.InfoRequest) (*pb.InfoResponse, error) {
	i, err := s.grpcServer.Info(ctx, r)
	if i != nil {
		i.BatchKeys = false
	}
	return i, err
}
func (s preBatchServer) GrantMany(context.Context, *pb.GrantManyRequest) (*pb.GrantManyResponse, error) {
	return pb.UnimplementedTransportServer{}.GrantMany(nil, nil)
}
func (s preBatchServer) RevokeMany(context.Context, *pb.RevokeManyRequest) (*pb.RevokeManyResponse, error) {
	return pb.UnimplementedTransportServer{}.RevokeMany(nil, nil)
}

type preBatchPlugin struct{ oldPlugin }

func (p *preBatchPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterTransportServer(s, preBatchServer{newGRPCServer(p.impl)})
	return nil
}

// keyBatchHost connects to impl (old: as a pre-batch plugin) over real
// gRPC and returns the host's transport and its RPC counter.
func keyBatchHost(t *testing.T, impl Transport, old bool) (Transport, *rpcCounter) {
	var set plugin.Plugin
	if old {
		set = &preBatchPlugin{oldPlugin{impl: impl}}
	}
	r := connectTest(t, impl, set)
	c := &rpcCounter{TransportClient: r.rpc}
	r.rpc = c
	return r.asTransport(), c
}

// Item by item, whichever way the host reaches the plugin: the good
// windows granted and revoked beside a bad window and an unknown key, and
// the unknown key never reported revoked. A plugin that serves batches gets
// one RPC per batch; one from before them (no batch_keys) gets one RPC per
// key, and works as before.
func TestKeyBatchesItemByItem(t *testing.T) {
	for _, tc := range []struct {
		name        string
		old         bool
		wantBatcher bool
		wantRPCs    [2]int64 // single, batch
	}{
		{"new-host-new-plugin", false, true, [2]int64{0, 2}},
		{"new-host-pre-batch-plugin", true, false, [2]int64{6, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			impl := newKeyTable()
			tr, rpcs := keyBatchHost(t, impl, tc.old)
			if _, ok := tr.(KeyBatcher); ok != tc.wantBatcher {
				t.Fatalf("host transport is a KeyBatcher: %v, want %v", ok, tc.wantBatcher)
			}
			g := tr.(Granter)
			ctx := context.Background()
			got := GrantKeys(ctx, g, []Window{{Region: 1, Length: 1}, {Region: 9, Length: 1}, {Region: 1, Length: 1}})
			if len(got) != 3 || got[0].Err != nil || got[2].Err != nil || got[0].Key == got[2].Key || !errdefs.Is(got[1].Err, errdefs.NotFound) {
				t.Fatalf("GrantKeys: %+v, want two keys and not-found between them", got)
			}
			rv := RevokeKeys(ctx, g, []Key{got[0].Key, 999, got[2].Key})
			if len(rv) != 3 || rv[0].Err != nil || rv[2].Err != nil || !errdefs.Is(rv[1].Err, errdefs.NotFound) || rv[0].Result.WritesApplied != 1 {
				t.Fatalf("RevokeKeys: %+v, want two revoked and not-found between them", rv)
			}
			if impl.live[got[0].Key] || impl.live[got[2].Key] {
				t.Fatalf("keys reported revoked are live at the plugin")
			}
			if s, b := rpcs.single.Load(), rpcs.batch.Load(); s != tc.wantRPCs[0] || b != tc.wantRPCs[1] {
				t.Fatalf("%d single and %d batch RPCs, want %v", s, b, tc.wantRPCs)
			}
		})
	}
}

// A host from before batch keys uses Grant and Revoke only; a new plugin
// still answers them (and the batch_keys it declares is a field such a
// host does not read).
func TestKeyBatchesPreBatchHost(t *testing.T) {
	r := connectTest(t, newKeyTable(), nil)
	old := &remoteGranter{r} // what asTransport returned before batch keys
	ctx := context.Background()
	k, err := old.Grant(ctx, Window{Region: 1, Length: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Revoke(ctx, k); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Revoke(ctx, 999); !errdefs.Is(err, errdefs.NotFound) {
		t.Fatalf("Revoke of an unknown key: %v, want not-found", err)
	}
}

// revokeAnswer is a plugin's gRPC answer to RevokeMany, made up.
type revokeAnswer struct {
	pb.TransportClient
	items []*pb.RevokeItem
}

func (c revokeAnswer) RevokeMany(context.Context, *pb.RevokeManyRequest, ...grpc.CallOption) (*pb.RevokeManyResponse, error) {
	return &pb.RevokeManyResponse{Items: c.items}, nil
}

// The host reports a key revoked only on an item that says revoked and no
// error: an item left out, one that does not say revoked, or one that says
// revoked with an error class revokes nothing the host relies on.
func TestRevokeManyHostTrustsOnlyRevokedItems(t *testing.T) {
	items := []*pb.RevokeItem{
		{Revoked: true, WritesApplied: 3},
		{},                             // says nothing
		{Revoked: true, ErrorClass: 5}, // contradicts itself
		// the fourth is left out
	}
	host := &remoteBatchGranter{&remoteGranter{&remote{rpc: revokeAnswer{items: items}}}}
	got := RevokeKeys(context.Background(), host, []Key{1, 2, 3, 4})
	if got[0].Err != nil || got[0].Result.WritesApplied != 3 {
		t.Fatalf("item 0: %+v, want revoked", got[0])
	}
	for i := 1; i < 4; i++ {
		if got[i].Err == nil {
			t.Fatalf("item %d reported revoked: %+v", i, got[i])
		}
	}
	if c := errdefs.ClassOf(got[2].Err); c != errdefs.Class(5) {
		t.Fatalf("item 2 class %v, want the plugin's class 5", c)
	}
}

// shortBatcher answers fewer items than asked, and grants the zero key.
type shortBatcher struct{ *keyTable }

func (s shortBatcher) GrantMany(context.Context, []Window) []Granted { return []Granted{{Key: 0}} }
func (s shortBatcher) RevokeMany(context.Context, []Key) []Revoked   { return []Revoked{{}} }

// The host helpers hold an in-process KeyBatcher to the same rules.
func TestKeyHelpersCheckBatchAnswers(t *testing.T) {
	ctx := context.Background()
	g := GrantKeys(ctx, shortBatcher{newKeyTable()}, []Window{{Region: 1, Length: 1}, {Region: 1, Length: 1}})
	if len(g) != 2 || g[0].Err == nil || g[1].Err == nil {
		t.Fatalf("GrantKeys: %+v, want the zero key and the missing item failed", g)
	}
	r := RevokeKeys(ctx, shortBatcher{newKeyTable()}, []Key{1, 2})
	if len(r) != 2 || r[0].Err != nil || r[1].Err == nil {
		t.Fatalf("RevokeKeys: %+v, want the missing item not revoked", r)
	}
}
