package conformance

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// Issue 23 item 2: a plugin that keeps a decoy connection through the
// proxy while its data goes around it, and reports InDoubt (or
// FailedDefinite, or refuses the Post) under the fault, must not pass the
// fault: reached says NOT RUN (a skip) unless the write's bytes entered
// the faulted proxy. Bytes swallowed by a drop count as reached.
func TestProxyFaultReachedOnlyByDataThatEnteredIt(t *testing.T) {
	p := mustProxy(t, discardTarget(t))
	decoy, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer decoy.Close()
	for p.Links() == 0 {
		time.Sleep(time.Millisecond)
	}
	se := &session{proxy: p}
	const n = 1 << 20
	for _, kind := range []string{"drop", "stall", "reset", "delay"} {
		f := se.proxyFault(kind)
		if err := f.apply(); err != nil {
			t.Fatalf("%s: apply with a live decoy: %v", kind, err)
		}
		var sk skipError
		if err := f.reachedBy(n); !errors.As(err, &sk) {
			t.Errorf("%s: no byte of the write entered the proxy, yet reached said %v (want a skip)", kind, err)
		}
		f.release()
	}
	f := se.proxyFault("drop")
	if err := f.apply(); err != nil {
		t.Fatal(err)
	}
	if _, err := decoy.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for p.Entered() < 64<<10 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := f.reachedBy(n); err != nil {
		t.Fatalf("64 KiB entered the dropping proxy, yet: %v", err)
	}
	if p.Sent() != 0 {
		t.Fatalf("the drop forwarded %d bytes", p.Sent())
	}
	f.release()
}

// discardTarget is a TCP target on loopback that reads and discards
// whatever each connection sends; it returns its address.
func discardTarget(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	return ln.Addr().String()
}
