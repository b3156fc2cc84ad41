package tcp

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// grantOwn registers 1 MiB on tr and grants all of it, unbound: a key a
// hand-driven peer may name in its HELLO.
func grantOwn(t testing.TB, tr *Transport) sdk.Key {
	t.Helper()
	ctx := context.Background()
	mem, err := sdk.NewSharedMemory("own", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	region, err := tr.RegisterMemory(ctx, mem.Desc())
	if err != nil {
		t.Fatal(err)
	}
	k, err := tr.Grant(ctx, sdk.Window{Region: region, Length: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A hand-driven peer for tests that speak the wire directly: a stranger
// with its own certificate, or a fake receiver.

func newTestIdentity(t testing.TB) *identity {
	t.Helper()
	id, err := newIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// dialAs opens a data connection to the receiver at addr (host:port#pin)
// authenticated as id, and says hello naming key (admission.go: the
// receiver must have granted it); it returns the connection and the
// session token the receiver answered with.
func dialAs(t testing.TB, addr string, id *identity, key sdk.Key) (*tls.Conn, sessionToken) {
	t.Helper()
	c := connectAs(t, addr, id)
	var hb [headerSize]byte
	(&header{Type: frameHello, Key: uint64(key)}).encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		t.Fatal(err)
	}
	h, err := decodeHeader(hb[:], 0)
	if err != nil || h.Type != frameHelloAck || h.Code != 0 {
		t.Fatalf("hello reply %+v, %v", h, err)
	}
	return c, h.token()
}

// connectAs opens a TLS connection to the receiver at addr as id, without
// a first frame.
func connectAs(t testing.TB, addr string, id *identity) *tls.Conn {
	t.Helper()
	hostPort, pin, ok, err := splitPin(addr)
	if err != nil || !ok {
		t.Fatalf("address %q: %v", addr, err)
	}
	raw, err := net.DialTimeout("tcp", hostPort, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, id.clientTLS(pin))
	t.Cleanup(func() { _ = raw.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Time{})
	return c
}

// quiesceAs asks the receiver at addr, as id, to end session tok, and
// returns its answer code.
func quiesceAs(t testing.TB, addr string, id *identity, tok sessionToken) uint16 {
	t.Helper()
	c := connectAs(t, addr, id)
	defer c.Close()
	var hb [headerSize]byte
	q := header{Type: frameQuiesce}
	q.setToken(tok)
	q.encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		t.Fatal(err)
	}
	h, err := decodeHeader(hb[:], 0)
	if err != nil || h.Type != frameQuiesced {
		t.Fatalf("quiesce reply %+v, %v", h, err)
	}
	return h.Code
}

// listenAs is a TLS listener holding id, and its pinned address.
func listenAs(t testing.TB, id *identity) (net.Listener, string) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", id.serverTLS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln, pinnedAddress(ln.Addr().String(), id.fp)
}
