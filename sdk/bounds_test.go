package sdk

import (
	"context"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
)

func TestWindowCovers(t *testing.T) {
	pieced := Window{Length: 3*8192 + 4096, Stride: 8192, Piece: 4096}
	for _, c := range []struct {
		w      Window
		off, n uint64
		want   bool
	}{
		{Window{Length: 4096}, 0, 4096, true},
		{Window{Length: 4096}, 1, 4096, false},
		{Window{Length: 4096}, 0, 0, false},
		{Window{Length: 4096}, ^uint64(0), 2, false},
		{pieced, 0, 4096, true},
		{pieced, 8192, 4096, true},
		{pieced, 3 * 8192, 4096, true},
		{pieced, 4096, 4096, false},     // the gap: another rank's shard
		{pieced, 2048, 4096, false},     // straddles a piece's end
		{pieced, 0, 8192 + 4096, false}, // spans two pieces and the gap
		{pieced, 8192 + 4095, 1, true},
		{pieced, 8192 + 4096, 1, false},
		{pieced, 4 * 8192, 1, false}, // past the window
	} {
		if got := c.w.Covers(c.off, c.n); got != c.want {
			t.Errorf("%+v.Covers(%d, %d) = %v, want %v", c.w, c.off, c.n, got, c.want)
		}
	}
}

func TestWindowCheck(t *testing.T) {
	for _, w := range []Window{{}, {Length: 1, Piece: 1}, {Length: 8, Stride: 4}, {Length: 8, Stride: 4, Piece: 5}, {Offset: ^uint64(0), Length: 2}} {
		if err := w.Check(); !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("%+v.Check() = %v, want invalid-argument", w, err)
		}
	}
	if err := (Window{Length: 8, Stride: 4, Piece: 4}).Check(); err != nil {
		t.Errorf("a well-formed pieced window: %v", err)
	}
}

// grantRecorder is a plugin's transport that declares bounds and records
// the windows it is asked to grant.
type grantRecorder struct {
	Transport
	bounds Bounds
	got    []Window
}

func (g *grantRecorder) Info(context.Context) (Info, error) {
	return Info{Name: "recorder", Capabilities: Capabilities{Bounds: g.bounds}}, nil
}

func (g *grantRecorder) Grant(_ context.Context, w Window) (Key, error) {
	g.got = append(g.got, w)
	return 7, nil
}

func (g *grantRecorder) Revoke(context.Context, Key) (RevokeResult, error) {
	return RevokeResult{}, nil
}

// grantClient forwards Grant straight to a grpcServer (no network) so the
// host side and the plugin side of the guard are tested separately.
type grantClient struct {
	pb.TransportClient
	srv   *grpcServer
	calls int
}

func (c *grantClient) Grant(ctx context.Context, r *pb.GrantRequest, _ ...grpc.CallOption) (*pb.GrantResponse, error) {
	c.calls++
	return c.srv.Grant(ctx, r)
}

var piecedWindow = Window{Region: 1, Offset: 4096, Length: 8192 + 4096, Stride: 8192, Piece: 4096, Writer: "w"}

// A pieced window reaches a plugin that enforces pieces intact, and is
// refused (Unimplemented) by the host before it leaves, and by the plugin's
// sdk before its transport sees it, where the plugin declares less.
func TestPiecedWindowOnlyToPieceEnforcingPlugins(t *testing.T) {
	ctx := context.Background()
	for _, b := range []Bounds{BoundsNone, BoundsWindow, BoundsPieces} {
		t.Run(b.String(), func(t *testing.T) {
			impl := &grantRecorder{bounds: b}
			srv := newGRPCServer(impl)
			// Info crosses the wire with the declared bounds.
			ir, err := srv.Info(ctx, &pb.InfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			info := infoFromPB(ir)
			if info.Capabilities.Bounds != b {
				t.Fatalf("bounds %v came back as %v", b, info.Capabilities.Bounds)
			}
			client := &grantClient{srv: srv}
			host := &remoteGranter{&remote{rpc: client, info: info}}
			_, hostErr := host.Grant(ctx, piecedWindow)
			// The plugin side, asked directly (a host that skipped its check).
			_, plugErr := srv.Grant(ctx, windowToPB(piecedWindow))
			if b == BoundsPieces {
				if hostErr != nil || plugErr != nil || len(impl.got) != 2 || impl.got[0] != piecedWindow {
					t.Fatalf("pieces: host %v, plugin %v, windows %+v", hostErr, plugErr, impl.got)
				}
				return
			}
			if !errdefs.Is(hostErr, errdefs.Unimplemented) || client.calls != 0 {
				t.Fatalf("host side: %v after %d RPCs, want unimplemented before any", hostErr, client.calls)
			}
			if !errdefs.Is(fromStatusError(plugErr), errdefs.Unimplemented) || len(impl.got) != 0 {
				t.Fatalf("plugin side: %v, transport saw %+v, want unimplemented and nothing", plugErr, impl.got)
			}
			// A contiguous window still goes through.
			if _, err := host.Grant(ctx, Window{Region: 1, Length: 4096}); err != nil || len(impl.got) != 1 {
				t.Fatalf("contiguous window: %v, %+v", err, impl.got)
			}
		})
	}
}
