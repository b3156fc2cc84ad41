package conformance

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// A plugin that keeps an idle connection through the proxy while its data
// takes another path must not have a proxy fault counted as applied: the
// stall hits the decoy, so apply succeeds, but a Succeeded write whose bytes
// did not cross the proxy is NOT RUN (a skip), never a pass. Bytes that did
// cross it count.
func TestProxyFaultCountsOnlyDataThatCrossedIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	p, err := NewProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	decoy, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	for p.Links() == 0 { // the proxy registers the link once it has dialled the target
		time.Sleep(time.Millisecond)
	}
	se := &session{proxy: p}

	f := se.proxyFault("delay")
	if err := f.apply(); err != nil {
		t.Fatalf("apply with a live connection: %v", err)
	}
	var sk skipError
	if err := f.carried(4096); !errors.As(err, &sk) {
		t.Fatalf("no byte crossed the proxy, yet carried said %v (want a skip)", err)
	}
	if _, err := decoy.Write(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	_ = decoy.Close()
	if n := <-got; n != 4096 {
		t.Fatalf("target got %d bytes", n)
	}
	if err := f.carried(4096); err != nil {
		t.Fatalf("4096 bytes crossed the proxy, yet: %v", err)
	}
	f.release()

	empty := &session{proxy: mustProxy(t, ln.Addr().String())}
	for _, kind := range []string{"delay", "stall", "drop", "reset"} {
		if err := empty.proxyFault(kind).apply(); !errors.As(err, &sk) {
			t.Errorf("%s on a proxy with no connection: %v, want a skip", kind, err)
		}
	}
}

func mustProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
