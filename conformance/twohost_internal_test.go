package conformance

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// The control channel: the right secret authenticates both ends and
// carries messages; a wrong secret is refused by both; a frame altered in
// flight or replayed fails its MAC.
func TestControlChannelAuthenticates(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	pair := func(srvSecret, cliSecret []byte) (*ctlConn, *ctlConn, error, error) {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		type res struct {
			cc  *ctlConn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			cc, err := ctlServer(a, srvSecret)
			if err != nil {
				_ = a.Close()
			}
			ch <- res{cc, err}
		}()
		cli, cerr := ctlClient(b, cliSecret)
		if cerr != nil {
			_ = b.Close()
		}
		r := <-ch
		return r.cc, cli, r.err, cerr
	}
	srv, cli, serr, cerr := pair(secret, secret)
	if serr != nil || cerr != nil {
		t.Fatalf("same secret: server %v, client %v", serr, cerr)
	}
	go func() { _ = cli.send(ctlRequest{Op: "hello"}) }()
	var q ctlRequest
	if err := srv.recv(&q); err != nil || q.Op != "hello" {
		t.Fatalf("recv: %v %+v", err, q)
	}
	if _, _, serr, _ = pair(secret, []byte("another secret of 32 bytes......")); serr == nil {
		t.Fatal("the server accepted a client with the wrong secret")
	}

	// A frame altered in flight: the MAC no longer matches.
	srv, cli, _, _ = pair(secret, secret)
	go func() {
		body := `{"op":"fill","off":1}`
		cli.sendSeq++
		f := `{"body":` + body + `,"mac":"` + mac(cli.key, "C", "1", `{"op":"fill","off":0}`) + `"}` + "\n"
		_, _ = cli.c.Write([]byte(f))
	}()
	if err := srv.recv(&q); err == nil || !strings.Contains(err.Error(), "authentication") {
		t.Fatalf("an altered frame: %v, want an authentication failure", err)
	}
	// A replayed frame: the sequence number moved on.
	srv, cli, _, _ = pair(secret, secret)
	go func() {
		f := `{"body":{"op":"bye"},"mac":"` + mac(cli.key, "C", "1", `{"op":"bye"}`) + `"}` + "\n"
		_, _ = cli.c.Write([]byte(f + f))
	}()
	if err := srv.recv(&q); err != nil {
		t.Fatalf("first frame: %v", err)
	}
	if err := srv.recv(&q); err == nil {
		t.Fatal("a replayed frame was accepted")
	}
}

// A kernel fault on the veth that touched no packet of a write is NOT RUN
// (a skip), never a pass: the reached and carried guards of the drop, reset
// and reject faults, with nothing sent while they held.
func TestVethFaultsReachNothingWithoutTraffic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces (ip netns add)")
	}
	n, err := newNetnsPair()
	if err != nil {
		t.Skipf("cannot make network namespaces here: %v", err)
	}
	defer n.close()
	reset, abort := n.resetFault()
	faults := []fault{n.dropFault(), reset}
	if rej, err := n.rejectFault(); err == nil {
		faults = append(faults, rej)
	} else {
		t.Logf("reject not checked: %v", err)
	}
	for _, f := range faults {
		if err := f.apply(); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if f.name == reset.name {
			abort()
		}
		f.release()
		var sk skipError
		if err := f.reachedBy(1 << 20); !errors.As(err, &sk) {
			t.Errorf("%s: nothing crossed the link, yet reached said %v (want a skip)", f.name, err)
		}
		// A Succeeded under it is a write that never met it (the reject
		// had no such guard: link-lossy passed whatever the rule matched).
		if f.carried == nil {
			t.Errorf("%s: no guard for a Succeeded that went around it", f.name)
		} else if err := f.carried(1 << 20); !errors.As(err, &sk) {
			t.Errorf("%s: nothing crossed the link, yet carried said %v (want a skip)", f.name, err)
		}
	}
	slow := n.slowFault()
	if err := slow.apply(); err != nil {
		t.Fatal(err)
	}
	slow.release()
	var sk skipError
	if err := slow.carried(1 << 20); !errors.As(err, &sk) {
		t.Errorf("tbf: nothing crossed the link, yet carried said %v (want a skip)", err)
	}
}

// The target host refuses a client with the wrong secret and keeps
// waiting; the right secret then gets its answers (over loopback: no root).
func TestTargetHostRefusesStrangers(t *testing.T) {
	addr, secret, done := startTestTarget(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctlClient(c, []byte("a wrong secret, also 32 bytes..!")); err == nil {
		t.Fatal("a client with the wrong secret was authenticated")
	}
	_ = c.Close()
	if c, err = net.Dial("tcp", addr); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, err := ctlClient(c, secret)
	if err != nil {
		t.Fatalf("the right secret after a stranger: %v", err)
	}
	h, err := cc.call(ctlRequest{Op: "hello"})
	if err != nil || h.Endpoint.Address == "" || h.SHA256 == "" || h.Host == nil {
		t.Fatalf("hello: %+v %v", h, err)
	}
	if _, err := cc.call(ctlRequest{Op: "fill", Off: 1 << 20, N: 1}); err == nil {
		t.Error("a fill outside the destination was accepted")
	}
	if r, err := cc.call(ctlRequest{Op: "compare", Off: 0, Src: 0, N: 16}); err != nil || r.Change == "" {
		t.Errorf("compare of untouched memory with the pattern: %+v %v (want a mismatch)", r, err)
	}
	if _, err := cc.call(ctlRequest{Op: "bye"}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("target after bye: %v", err)
	}
}

// After a blackhole, bytes TCP still holds are resent only when the
// retransmission timer fires: the watch after release is extended by the
// longest RTO ss reports for the link's sockets (fractional or whole ms).
func TestMaxRTOReadsTheLongestTimer(t *testing.T) {
	out := "ESTAB 0 65536 10.213.213.1:40000 10.213.213.2:41000\n\t cubic wscale:7,7 rto:204 rtt:0.05/0.025 ato:40\n" +
		"ESTAB 0 0 10.213.213.1:40002 10.213.213.2:41000\n\t cubic rto:1632.5 backoff:3 rtt:0.1/0.05\n"
	if got, want := maxRTOIn(out), 1632500*time.Microsecond; got != want {
		t.Fatalf("maxRTOIn = %v, want %v", got, want)
	}
	if got := maxRTOIn("no sockets"); got != 0 {
		t.Fatalf("maxRTOIn without sockets = %v", got)
	}
	f := fault{settle: func() time.Duration { return time.Second }}
	if got := f.watchAfter(3 * time.Second); got != 4*time.Second {
		t.Fatalf("watchAfter = %v, want the guard plus the settle time", got)
	}
}
