package tcp

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := header{Type: frameWrite, Code: writeAckNow, Seq: 7, Key: 9, Offset: 11, Length: 13, Deadline: 15}
	var b [headerSize]byte
	h.encode(b[:])
	got, err := decodeHeader(b[:], 1<<20)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := func() []byte {
		var b [headerSize]byte
		(&header{Type: frameWrite, Seq: 1, Key: 1, Length: 10, Deadline: 1}).encode(b[:])
		return b[:]
	}
	mut := []struct {
		name string
		f    func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:10] }},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }},
		{"version", func(b []byte) []byte { b[4] = 1; return b }},
		{"type", func(b []byte) []byte { b[5] = 99; return b }},
		{"zero length", func(b []byte) []byte { copy(b[32:40], make([]byte, 8)); return b }},
		{"too long", func(b []byte) []byte { b[39] = 0x7f; return b }},
		{"no deadline", func(b []byte) []byte { copy(b[40:48], make([]byte, 8)); return b }},
		{"unknown flag on write", func(b []byte) []byte { b[6] = 2; return b }},
	}
	for _, m := range mut {
		if _, err := decodeHeader(m.f(good()), 1<<20); err == nil {
			t.Errorf("%s: accepted", m.name)
		}
	}
}

// FuzzDecodeHeader: whatever a peer sends, the decoder returns a header that
// satisfies the invariants the receiver relies on, or an error; never panics.
func FuzzDecodeHeader(f *testing.F) {
	var b [headerSize]byte
	for _, h := range []header{
		{Type: frameWrite, Length: 4096, Deadline: 1},
		{Type: frameAck, Code: 2},
		{Type: frameHello}, {Type: frameQuiesce, Key: 1, Offset: 2}, {Type: frameQuiesced, Code: 1},
	} {
		h.encode(b[:])
		f.Add(append([]byte(nil), b[:]...))
	}
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		const max = 1 << 20
		h, err := decodeHeader(in, max)
		if err != nil {
			return
		}
		if h.Type == frameWrite && (h.Length == 0 || h.Length > max || h.Deadline <= 0) {
			t.Fatalf("accepted bad write %+v", h)
		}
		var out [headerSize]byte
		h.encode(out[:])
		if !bytes.Equal(out[:], in[:headerSize]) {
			t.Fatalf("decode/encode not inverse")
		}
	})
}

// Garbage on the wire closes that connection, is counted, and the plugin
// keeps serving — out of process, through the real listener: cleartext
// junk fails the TLS handshake; junk inside an authenticated connection is
// a garbage frame.
func TestGarbageOnTheWire(t *testing.T) {
	rp := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
	s := newTCP(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: s, Receiver: rp.Transport()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ep, _ := rp.Transport().LocalEndpoint(ctx)
	hostPort, _, _, err := splitPin(ep.Address)
	if err != nil {
		t.Fatal(err)
	}
	untilClosed := func(c net.Conn) {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 256)
		for { // the receiver closes the connection on us
			if _, err := c.Read(buf); err != nil {
				break
			}
		}
		c.Close()
	}
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 48))),
		bytes.Repeat([]byte{0xff}, 200),
	} {
		c, err := net.Dial("tcp", hostPort)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(junk)
		untilClosed(c)
	}
	// A valid hello, then a bogus frame, over TLS.
	c, _ := dialAs(t, ep.Address, newTestIdentity(t), grantAll(t, e))
	var b [headerSize]byte
	(&header{Type: frameAck}).encode(b[:])
	_, _ = c.Write(b[:])
	untilClosed(c)
	m, err := rp.Transport().(sdk.StatsReporter).Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m[statHandshakeFail] < 2 || m[statGarbage] < 1 {
		t.Fatalf("failed handshakes %d (want 2), garbage frames %d (want 1)", m[statHandshakeFail], m[statGarbage])
	}
	if err := sdktest.CheckNamed("write-lands-then-succeeds").Run(ctx, e); err != nil {
		t.Fatalf("after garbage: %v", err)
	}
}
