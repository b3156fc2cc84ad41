package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
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

// At MaxConns the oldest silent connection (one that never wrote) is
// closed to make room, long before its handshake timeout: connections that
// say nothing cannot hold the port. Once every connection has written, one
// more is refused on accept.
func TestDataPortConnectionCap(t *testing.T) {
	const maxConns = 4
	e, _, r := newPair(t, Config{MaxConns: maxConns, HandshakeTimeout: time.Minute})
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
		waitForConns(t, r, i+1) // accepted in order: squat[0] is the oldest
	}
	if c := post(t, e, e.Peer, key, 0, 0, 4096); c.Status != sdk.Succeeded {
		t.Fatalf("honest write at the cap: %+v", c)
	}
	// Well before the handshake timeout: the oldest squatter was evicted.
	_ = squat[0].SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := squat[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("oldest silent connection: read %v, want it closed by the receiver", err)
	}
	waitStat(t, r, statSilentEvicted, 1)
	// Every connection now writes: another is refused on accept.
	var writers []*tls.Conn
	for i := 1; i < maxConns; i++ {
		c, _ := dialAs(t, ep.Address, newTestIdentity(t), key)
		writeOne(t, c, key)
		writers = append(writers, c)
	}
	extra, err := net.Dial("tcp", hostPort)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection over a cap of writers: read %v, want it closed by the receiver", err)
	}
	waitStat(t, r, statConnsRefused, 1)
	for _, c := range writers {
		_ = c.Close()
	}
}

// writeOne sends one 1-byte write under key on c and reads its verdict.
func writeOne(t *testing.T, c *tls.Conn, key sdk.Key) {
	t.Helper()
	var hb [headerSize]byte
	(&header{Type: frameWrite, Code: writeAckNow, Seq: 1, Key: uint64(key), Length: 1, Deadline: time.Now().Add(time.Minute).UnixNano()}).encode(hb[:])
	if _, err := c.Write(append(hb[:], 0xEE)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		t.Fatal(err)
	}
}

// A session that says HELLO and then never writes is closed after
// FirstWriteTimeout, not IdleTimeout; the known-unsafe admit-any keeps it.
func TestSilentSessionIsClosed(t *testing.T) {
	for _, mode := range []unsafeMode{safe, unsafeAdmitAny} {
		r := newTCP(t, Config{FirstWriteTimeout: 300 * time.Millisecond, IdleTimeout: time.Hour, unsafe: mode})
		ep, _ := r.LocalEndpoint(context.Background())
		c, _ := dialAs(t, ep.Address, newTestIdentity(t), grantOwn(t, r))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		closed := errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
		if mode == safe && !closed {
			t.Fatalf("silent session: read %v, want it closed by the receiver", err)
		}
		if mode == unsafeAdmitAny && closed {
			t.Fatalf("admit-any closed a silent session: the test cannot fail")
		}
	}
}

// A HELLO naming a key never granted, or a revoked one, gets no session
// and the same answer; a writer-bound key opens no session for another
// identity; one identity holds at most MaxSessionsPerWriter sessions.
func TestHelloNeedsAGrantedKey(t *testing.T) {
	r := newTCP(t, Config{MaxSessionsPerWriter: 3})
	ctx := context.Background()
	ep, _ := r.LocalEndpoint(ctx)
	revoked := grantOwn(t, r)
	if _, err := r.Revoke(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	answers := map[string]header{}
	for name, key := range map[string]sdk.Key{"unknown": sdk.Key(randomNonZero()), "revoked": revoked} {
		c := connectAs(t, ep.Address, newTestIdentity(t))
		answers[name] = helloReply(t, c, key)
	}
	if u, v := answers["unknown"], answers["revoked"]; u != v || u.Code != helloRefused {
		t.Fatalf("HELLO answers: unknown %+v, revoked %+v; want one refusal", u, v)
	}
	good := grantOwn(t, r)
	id := newTestIdentity(t)
	for i := 0; i < 3; i++ {
		dialAs(t, ep.Address, id, good)
	}
	c := connectAs(t, ep.Address, id)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var hb [headerSize]byte
	(&header{Type: frameHello, Key: uint64(good)}).encode(hb[:])
	_, _ = c.Write(hb[:])
	if _, err := io.ReadFull(c, hb[:]); err == nil {
		t.Fatalf("a fourth session of one identity was opened, cap 3")
	}
	waitStat(t, r, statSessionsCapped, 1)
	waitStat(t, r, statHelloRefused, 2)
}

// helloReply says HELLO naming key on c and returns the answer.
func helloReply(t *testing.T, c *tls.Conn, key sdk.Key) header {
	t.Helper()
	var hb [headerSize]byte
	(&header{Type: frameHello, Key: uint64(key)}).encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		t.Fatal(err)
	}
	h, err := decodeHeader(hb[:], 0)
	if err != nil {
		t.Fatal(err)
	}
	return h
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
	c, _ := dialAs(t, ep.Address, newTestIdentity(t), grantOwn(t, r))
	var hb [headerSize]byte
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	for i := 1; ; i++ {
		(&header{Type: frameWrite, Code: writeAckNow, Seq: uint64(i), Key: randomNonZero(), Length: 1, Deadline: time.Now().Add(time.Minute).UnixNano()}).encode(hb[:])
		if _, err := c.Write(append(hb[:], 0xEE)); err != nil {
			break
		}
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			if i <= maxUnknownKeyWrites {
				t.Fatalf("closed after %d guesses, want %d", i-1, maxUnknownKeyWrites)
			}
			break
		}
		if h, err := decodeHeader(hb[:], 0); err != nil || ackCode(h.Code) != ackRevoked { // one answer for unknown and revoked keys
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

// Refusals are logged at most once a second, however many there are (a
// guesser must not fill the host's log); Stats count every one.
func TestRefusalsLoggedAtABoundedRate(t *testing.T) {
	var buf syncBuffer
	r, err := New(Config{}, hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ep, _ := r.LocalEndpoint(context.Background())
	const n = 100
	start := time.Now()
	for i := 0; i < n; i++ {
		c := connectAs(t, ep.Address, newTestIdentity(t))
		if h := helloReply(t, c, sdk.Key(randomNonZero())); h.Code != helloRefused {
			t.Fatalf("HELLO under a guessed key: %+v", h)
		}
		_ = c.Close()
	}
	elapsed := time.Since(start)
	waitStat(t, r, statHelloRefused, n)
	lines := strings.Count(buf.String(), "refused a data session")
	if limit := 1 + int(elapsed/time.Second); lines > limit {
		t.Fatalf("%d refusals in %v logged %d times, want at most %d", n, elapsed, lines, limit)
	}
	t.Logf("%d refusals in %v: %d log lines", n, elapsed, lines)
}
