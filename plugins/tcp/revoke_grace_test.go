package tcp

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// graceReceiver is a receiver with one region and two keys over its halves,
// and a hand-driven writer session (hello'd under the first key).
type graceReceiver struct {
	r           *Transport
	mem         *sdk.SharedMemory
	keys        [2]sdk.Key
	conn        io.ReadWriter
	half        uint64
	seq         uint64
	setDeadline func(time.Time) error
}

func newGraceReceiver(t *testing.T, cfg Config) *graceReceiver {
	t.Helper()
	ctx := context.Background()
	g := &graceReceiver{r: newTCP(t, cfg), half: 1 << 16}
	var err error
	if g.mem, err = sdk.NewSharedMemory("grace", 2*g.half); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.mem.Close() })
	region, err := g.r.RegisterMemory(ctx, g.mem.Desc())
	if err != nil {
		t.Fatal(err)
	}
	for i := range g.keys {
		if g.keys[i], err = g.r.Grant(ctx, sdk.Window{Region: region, Offset: uint64(i) * g.half, Length: g.half}); err != nil {
			t.Fatal(err)
		}
	}
	ep, _ := g.r.LocalEndpoint(ctx)
	c, _ := dialAs(t, ep.Address, newTestIdentity(t), g.keys[0])
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	g.conn = c
	return g
}

// startWrite sends a write's header under key i and the first part of its
// payload, and waits until the receiver is applying it.
func (g *graceReceiver) startWrite(t *testing.T, i int, payload []byte, first int) {
	t.Helper()
	g.send(t, i, payload[:first], len(payload))
	g.r.mu.Lock()
	e := g.r.keys[g.keys[i]]
	g.r.mu.Unlock()
	for {
		e.mu.Lock()
		n := e.inflight
		e.mu.Unlock()
		if n > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// send sends a write's header (n bytes under key i) and part.
func (g *graceReceiver) send(t *testing.T, i int, part []byte, n int) {
	t.Helper()
	g.seq++
	var hb [headerSize]byte
	(&header{Type: frameWrite, Code: writeAckNow, Seq: g.seq, Key: uint64(g.keys[i]), Length: uint64(n),
		Deadline: time.Now().Add(time.Minute).UnixNano()}).encode(hb[:])
	if _, err := g.conn.Write(append(hb[:], part...)); err != nil {
		t.Fatal(err)
	}
}

// ack reads one acknowledgement.
func (g *graceReceiver) ack() (header, error) {
	var hb [headerSize]byte
	if _, err := io.ReadFull(g.conn, hb[:]); err != nil {
		return header{}, err
	}
	return decodeHeader(hb[:], 0)
}

func (g *graceReceiver) revoke(k sdk.Key) <-chan sdk.RevokeResult {
	done := make(chan sdk.RevokeResult, 1)
	go func() {
		res, _ := g.r.Revoke(context.Background(), k)
		done <- res
	}()
	return done
}

// A write whose payload is still arriving when its key is revoked finishes
// within the grace: it lands (before Revoke returns), and its connection —
// which carries other requests' writes — stays up. Cutting the connection
// at once (what the transport did) made every other write on it InDoubt:
// with eager revocation in the demo, a sixth of the throughput.
func TestRevokeLetsAWriteInProgressFinish(t *testing.T) {
	g := newGraceReceiver(t, Config{RevokeGrace: time.Minute})
	payload := bytes.Repeat([]byte{0xA5}, 8192)
	g.startWrite(t, 0, payload, 4096)
	done := g.revoke(g.keys[0])
	if _, err := g.conn.Write(payload[4096:]); err != nil {
		t.Fatal(err)
	}
	if h, err := g.ack(); err != nil || ackCode(h.Code) != ackOK || h.Seq != 1 {
		t.Fatalf("the write in progress at Revoke: %+v, %v; want applied", h, err)
	}
	if res := <-done; res.WritesApplied != 1 {
		t.Fatalf("Revoke: %+v, want the write in progress applied", res)
	}
	if !bytes.Equal(g.mem.Bytes()[:len(payload)], payload) {
		t.Fatal("the write in progress did not land before Revoke returned")
	}
	other := bytes.Repeat([]byte{0x5A}, 4096)
	g.send(t, 1, other, len(other))
	if h, err := g.ack(); err != nil || ackCode(h.Code) != ackOK || h.Seq != 2 {
		t.Fatalf("a later write on the same connection under a live key: %+v, %v; want applied", h, err)
	}
}

// A write that does not finish within the grace is cut off with its
// connection, and Revoke returns: a writer that trickles cannot hold a
// revocation. Nothing sent after Revoke returned lands.
func TestRevokeCutsOffAWriteAfterTheGrace(t *testing.T) {
	g := newGraceReceiver(t, Config{RevokeGrace: 50 * time.Millisecond})
	payload := bytes.Repeat([]byte{0xA5}, 8192)
	g.startWrite(t, 0, payload, 4096)
	before := bytes.Clone(g.mem.Bytes()[4096:8192])
	select {
	case <-g.revoke(g.keys[0]):
	case <-time.After(30 * time.Second):
		t.Fatal("Revoke waits on a writer that stopped sending")
	}
	_, _ = g.conn.Write(payload[4096:])
	if _, err := g.ack(); err == nil {
		t.Fatal("the connection of a write cut off by Revoke is still up")
	}
	if !bytes.Equal(g.mem.Bytes()[4096:8192], before) {
		t.Fatal("bytes sent after Revoke returned landed")
	}
}
