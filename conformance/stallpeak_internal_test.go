package conformance

import (
	"errors"
	"net"
	"testing"
	"time"
)

// A stalled proxy is reached by what a writer pushed into it, not by any
// byte: a decoy connection that sends a heartbeat byte into the stall
// (and so "notices" it) must leave the check NOT RUN, while a data
// connection whose write waits, unread, behind the stall counts even when
// the writer gives up and resets the connection before the stall ends.
// With the old one-byte floor for stalls the heartbeat counted as reached.
func TestStallReachedByQueuedDataNotByAHeartbeat(t *testing.T) {
	p := mustProxy(t, discardTarget(t))
	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	decoy := dial()
	for p.Links() == 0 {
		time.Sleep(time.Millisecond)
	}
	se := &session{proxy: p}
	const n = 1 << 20
	f := se.proxyFault("stall")
	if err := f.apply(); err != nil {
		t.Fatal(err)
	}
	if _, err := decoy.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	for p.Entered() == 0 {
		time.Sleep(time.Millisecond)
	}
	var sk skipError
	if err := f.reachedBy(n); !errors.As(err, &sk) {
		t.Fatalf("a heartbeat byte entered the stall, yet reached said %v (want a skip)", err)
	}
	f.release()

	data := dial()
	for p.Links() < 2 {
		time.Sleep(time.Millisecond)
	}
	f = se.proxyFault("stall")
	if err := f.apply(); err != nil {
		t.Fatal(err)
	}
	// A first small write is what the stalled pump's one read takes; the
	// rest waits in the proxy's receive queue.
	if _, err := data.Write(make([]byte, 36)); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = data.Write(make([]byte, 64<<10)) }()
	for p.StallPeak() < 4096 {
		time.Sleep(time.Millisecond)
	}
	_ = data.(*net.TCPConn).SetLinger(0)
	_ = data.Close() // the writer gives up: a reset takes its queued bytes with it
	if err := f.reachedBy(n); err != nil {
		t.Fatalf("64 KiB waited behind the stall (peak %d), yet: %v", p.StallPeak(), err)
	}
	f.release()
}
