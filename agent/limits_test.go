package agent

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/routerlink"
	"github.com/kvfence/kvfence/sdk"
)

// Finding 6 (issue 15), the control port: connections that never speak, or
// open a stream and never send Hello, were kept for ever (a legitimate
// router got no answer at the fd limit). With a cap of 5 connections per
// pool (admission.go), four silent ones are dropped after the handshake
// timeout, a silent stream after the same, and an honest rank still links;
// a router beyond the router cap is refused, classified (its connection is
// the fifth authenticated one, within the pool).
func TestControlPortDropsSilentConnections(t *testing.T) {
	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 4, ShardBytes: 4096, Shards: 1, Lease: time.Second,
		MaxHold: 5 * time.Second, ControlAddr: "127.0.0.1:0", commands: func(c routerlink.Link) { <-c.(*commandLink).l.closed() },
		Limits: Limits{MaxConns: 5, HandshakeTimeout: 300 * time.Millisecond, IdleTimeout: time.Second, MaxRouters: 2}}, dp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)

	var silent []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", d.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		silent = append(silent, c)
	}
	for i, c := range silent {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("silent connection %d still open after 10s", i)
				}
				break // closed by decode
			}
		}
	}

	// A stream that never sends Hello is ended.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, st := openSilentStream(t, ctx, d.Addr())
	defer cc.Close()
	if err := st.RecvMsg(new(frame)); err == nil {
		t.Fatal("a stream without Hello got a frame")
	} else if ctx.Err() != nil {
		t.Fatal("a stream without Hello was kept open")
	}

	// Honest peers are served.
	l, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}})
	if err != nil {
		t.Fatalf("an honest rank after the silent connections: %v", err)
	}
	defer l.close()
	var routers []*commandLink
	for i := 0; i < 2; i++ {
		r, err := dialCommands(ctx, d.Addr(), nil, RoleDecode, 0)
		if err != nil {
			t.Fatalf("router %d: %v", i, err)
		}
		routers = append(routers, r)
	}
	defer func() {
		for _, r := range routers {
			r.Close()
		}
	}()
	if _, err := dialCommands(ctx, d.Addr(), nil, RoleDecode, 0); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a router beyond the cap: %v", err)
	}
}

// openSilentStream opens a control stream and sends nothing on it.
func openSilentStream(t *testing.T, ctx context.Context, addr string) (*grpc.ClientConn, grpc.ClientStream) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(frameCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	st, err := cc.NewStream(ctx, linkStreamDesc, linkMethod)
	if err != nil {
		t.Fatal(err)
	}
	return cc, st
}

// Finding 6, streams: one connection could open any number of link
// streams. Now a fifth stream on a connection waits until one of the four
// ends (each connection carries one link; a few allow overlap).
func TestStreamsPerConnectionAreCapped(t *testing.T) {
	d := startDecode(t)
	cc, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(frameCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 4; i++ {
		st, err := cc.NewStream(ctx, linkStreamDesc, linkMethod)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if err := st.SendMsg(&frame{Type: frameHello, Seq: 1, Hello: &peerHello{Role: RolePrefill, Rank: uint32(10 + i),
			ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}}}); err != nil {
			t.Fatalf("stream %d hello: %v", i, err)
		}
		if err := st.RecvMsg(new(frame)); err != nil { // its Welcome: the stream is up
			t.Fatalf("stream %d welcome: %v", i, err)
		}
	}
	fifth, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	st, err := cc.NewStream(fifth, linkStreamDesc, linkMethod)
	if err == nil {
		err = st.SendMsg(&frame{Type: frameHello, Seq: 1, Hello: &peerHello{Role: RolePrefill, Rank: 20, ShardBytes: 4096,
			Version: ControlVersion, Caps: peerCaps{Quiesce: true}}})
		if err == nil {
			err = st.RecvMsg(new(frame))
		}
	}
	if err == nil {
		t.Fatal("a fifth link stream on one connection was served")
	}
}
