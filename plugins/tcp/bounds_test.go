package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"golang.org/x/sys/unix"
)

// Regression tests for issue 15 finding 6 (the TCP plugin's part): the
// accept loop died for good on an Accept error, and the data port had no
// bound on connections, idle sessions, or a session guessing keys.

// waitStat polls r's counter until it reaches want.
func waitStat(t *testing.T, r *Transport, name string, want uint64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if m, _ := r.Stats(context.Background()); m[name] >= want {
			return
		}
		if time.Now().After(deadline) {
			m, _ := r.Stats(context.Background())
			t.Fatalf("%s = %d, want %d", name, m[name], want)
		}
	}
}

// A real EMFILE: the process runs out of descriptors with one connection
// waiting in the receiver's backlog. Accept fails; once descriptors are
// free again the connection is served and the write lands.
func TestAcceptSurvivesFDExhaustion(t *testing.T) {
	e, s, r := newPair(t, Config{})
	ctx := context.Background()
	key := grantAll(t, e)
	ep, _ := r.LocalEndpoint(ctx)
	peer, err := s.Connect(ctx, ep) // lazy: no socket yet
	if err != nil {
		t.Fatal(err)
	}
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	low := orig
	low.Cur = uint64(len(fds) + 64)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var dummies []int
	release := func() {
		for _, fd := range dummies {
			_ = unix.Close(fd)
		}
		dummies = nil
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &orig)
	}
	defer release()
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, syscall.EMFILE) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		dummies = append(dummies, fd)
	}
	// One descriptor for the sender's socket; none for the receiver's.
	_ = unix.Close(dummies[len(dummies)-1])
	dummies = dummies[:len(dummies)-1]
	b := e.Write(e.NewBatchID(), key, 0, 0, 4096)
	b.Peer = peer
	if err := s.Post(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitStat(t, r, statAcceptErrors, 1)
	release()
	c, err := e.Wait(b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != sdk.Succeeded {
		t.Fatalf("write after the descriptors came back: %+v (the data port stayed dead)", c)
	}
}

// Connections beyond MaxConns are closed at once; an honest sender is
// served again once the squatters are gone (here: their handshake timed
// out).
func TestDataPortConnectionCap(t *testing.T) {
	const maxConns = 4
	e, _, r := newPair(t, Config{MaxConns: maxConns, HandshakeTimeout: 2 * time.Second})
	ctx := context.Background()
	key := grantAll(t, e)
	ep, _ := r.LocalEndpoint(ctx)
	hostPort, _, _, _ := splitPin(ep.Address)
	var squat []net.Conn
	for i := 0; i < maxConns; i++ {
		c, err := net.Dial("tcp", hostPort)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		squat = append(squat, c)
	}
	waitForConns(t, r, maxConns)
	extra, err := net.Dial("tcp", hostPort)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	// Well before the handshake timeout: the receiver closes it on accept.
	_ = extra.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection over the cap: read %v, want it closed by the receiver", err)
	}
	waitStat(t, r, statConnsRefused, 1)
	// The squatters never handshake: they are dropped, and the port serves
	// an honest sender again.
	for _, c := range squat {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, _ = c.Read(make([]byte, 1))
	}
	if c := post(t, e, e.Peer, key, 0, 0, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("honest write after the squatters left: %+v", c)
	}
}

func waitForConns(t *testing.T, r *Transport, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.recv.mu.Lock()
		got := len(r.recv.conns)
		r.recv.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections accepted, want %d", got, n)
		}
	}
}

// An authenticated session that writes nothing for IdleTimeout is closed;
// its sender reconnects on its next Post.
func TestIdleSessionIsClosed(t *testing.T) {
	e, _, r := newPair(t, Config{IdleTimeout: 300 * time.Millisecond})
	key := grantAll(t, e)
	if c := post(t, e, e.Peer, key, 0, 0, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("first write: %+v", c)
	}
	waitStat(t, r, statIdleClosed, 1)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.recv.mu.Lock()
		n := len(r.recv.sessions)
		r.recv.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still open", n)
		}
	}
	// The sender's reader saw the close; let it retire the session.
	time.Sleep(100 * time.Millisecond)
	if c := post(t, e, e.Peer, key, 0, 4096, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("write after the idle close: %+v", c)
	}
}

// A session that keeps writing under keys never granted is guessing: it is
// closed after maxUnknownKeyWrites, and its writes all refused.
func TestGuessingSessionIsClosed(t *testing.T) {
	r := newTCP(t, Config{})
	ep, _ := r.LocalEndpoint(context.Background())
	c, _ := dialAs(t, ep.Address, newTestIdentity(t))
	var hb [headerSize]byte
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	for i := 1; ; i++ {
		(&header{Type: frameWrite, Seq: uint64(i), Key: randomNonZero(), Length: 1, Deadline: time.Now().Add(time.Minute).UnixNano()}).encode(hb[:])
		if _, err := c.Write(append(hb[:], 0xEE)); err != nil {
			break
		}
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			if i <= maxUnknownKeyWrites {
				t.Fatalf("closed after %d guesses, want %d", i-1, maxUnknownKeyWrites)
			}
			break
		}
		if h, err := decodeHeader(hb[:], 0); err != nil || ackCode(h.Code) != ackUnknownKey {
			t.Fatalf("guess %d: %+v, %v", i, h, err)
		}
		if i > maxUnknownKeyWrites+1 {
			t.Fatalf("still open after %d guesses", i)
		}
	}
	waitStat(t, r, statGuessesClosed, 1)
}

// A receiver that grants and revokes a key per request keeps only the keys
// revoked within the retention: the key table does not grow without bound.
// A write under a forgotten key is still refused.
func TestRevokedKeysAreForgotten(t *testing.T) {
	e, _, r := newPair(t, Config{WriteTTL: time.Millisecond})
	ctx := context.Background()
	var first sdk.Key
	grantRevoke := func() sdk.Key {
		k, err := r.Grant(ctx, sdk.Window{Region: e.DstID, Length: 4096})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Revoke(ctx, k); err != nil {
			t.Fatal(err)
		}
		return k
	}
	for i := 0; i < 100; i++ {
		if k := grantRevoke(); i == 0 {
			first = k
		}
	}
	time.Sleep(r.cfg.revokedRetention() + 100*time.Millisecond)
	grantRevoke()
	r.mu.Lock()
	n := len(r.keys)
	r.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d keys kept after the retention, want 1", n)
	}
	if c := post(t, e, e.Peer, first, 0, 0, 4096); c.Status != sdk.FailedDefinite {
		t.Fatalf("write under a forgotten key: %+v, want FailedDefinite", c)
	}
}
