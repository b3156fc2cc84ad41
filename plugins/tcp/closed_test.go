package tcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// stalledWrite is a write that sits in a live receiver's socket buffer: the
// receiver (a real plugin process) is stopped with SIGSTOP after its
// connection is up, then a batch is written to the socket. The receiver is
// alive and will read and apply the bytes as soon as it runs again.
type stalledWrite struct {
	t      *testing.T
	s      *Transport
	rp     *sdk.Plugin
	e      *sdktest.Env
	id     sdk.BatchID
	key    sdk.Key // granted over the receiver's whole window
	dstOff uint64
	n      uint64

	resumedAt, evidenceAt time.Time
}

func newStalledWrite(t *testing.T, cfg Config) *stalledWrite {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newTCP(t, cfg)
	rp := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
	e, k := grantedEnv(ctx, t, sdktest.Pair{Sender: s, Receiver: rp.Transport()})
	// The connection is up and the receiver applies writes.
	warm := e.NewBatchID()
	if err := s.Post(ctx, e.Write(warm, k, 0, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if c, err := e.Wait(warm); err != nil || c.Status != sdk.Succeeded {
		t.Fatalf("warm-up write: %+v, %v", c, err)
	}
	stopProcess(t, rp.Pid())
	w := &stalledWrite{t: t, s: s, rp: rp, e: e, key: k, id: e.NewBatchID(), dstOff: 256 << 10, n: 16 << 10}
	if err := s.Post(ctx, e.Write(w.id, k, 128<<10, w.dstOff, w.n)); err != nil {
		t.Fatal(err)
	}
	// Wait until the writer has handed the whole write to the socket (it
	// unpins the source region then): the bytes are on their way.
	s.mu.Lock()
	src := s.regions[e.SrcID]
	s.mu.Unlock()
	for deadline := time.Now().Add(30 * time.Second); ; {
		src.mu.Lock()
		users := src.users
		src.mu.Unlock()
		if users == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the write never left the sender")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if w.landed() {
		t.Fatal("the write landed although the receiver is stopped")
	}
	return w
}

// landed reports whether any byte of the stalled write is in the receiver's
// memory (the destination starts zeroed; the source has no zero byte there).
func (w *stalledWrite) landed() bool {
	dst := w.e.Dst.Bytes()[w.dstOff : w.dstOff+w.n]
	return !bytes.Equal(dst, make([]byte, w.n))
}

// quiesceAndWatch quiesces the stalled write: it tries once while the
// receiver is stopped, then runs resume (let it run again, or kill it) and
// retries until Quiesce gives evidence. It returns the evidence, whether the
// first try (receiver alive but stopped) gave any, and an error if a byte of
// the write landed after Quiesce returned its evidence: the property every
// evidence promises.
func (w *stalledWrite) quiesceAndWatch(resume func()) (res sdk.QuiesceResult, early bool, violation error) {
	w.t.Helper()
	resumed := false
	for attempt, deadline := 0, time.Now().Add(45*time.Second); ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		r, err := w.s.Quiesce(ctx, w.e.Peer, []sdk.BatchID{w.id})
		cancel()
		if err == nil {
			res = r
			w.evidenceAt = time.Now()
			break
		}
		if !resumed {
			resume()
			resumed = true
			w.resumedAt = time.Now()
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no quiescence evidence after the receiver resumed or died: %v", err)
		}
		if attempt%40 == 0 {
			w.t.Logf("Quiesce (try %d): %v", attempt+1, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	early = !resumed
	before := w.landed()
	if !resumed {
		resume()
	}
	// A live receiver applies what sits in its socket buffer within
	// milliseconds of running again; give it far longer than that.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !before && w.landed() {
			return res, early, fmt.Errorf("bytes of batch %d landed after Quiesce returned %s evidence (%s)", w.id, res.Evidence, res.Detail)
		}
	}
	return res, early, nil
}

func (w *stalledWrite) signal(sig syscall.Signal) func() {
	return func() {
		if err := syscall.Kill(w.rp.Pid(), sig); err != nil {
			w.t.Errorf("kill %v: %v", sig, err)
		}
	}
}

// A live receiver that is not reading (stopped) gives no evidence, whatever
// the sender does with its own side; once it runs again it confirms, and
// nothing lands after the evidence.
func TestQuiesceWaitsForStalledReceiver(t *testing.T) {
	w := newStalledWrite(t, Config{AckTimeout: time.Minute})
	res, early, violation := w.quiesceAndWatch(w.signal(syscall.SIGCONT))
	if violation != nil {
		t.Fatal(violation)
	}
	if early {
		t.Fatalf("Quiesce gave %s evidence while the receiver was alive with the write in its socket buffer", res.Evidence)
	}
	// Once it runs, it confirms, or applies and acknowledges the write
	// first (then the batch is settled and the evidence is harvested).
	t.Logf("after the receiver resumed: %s (%s)", res.Evidence, res.Detail)
}

// The receiver dies (kill -9) with the write unread in its socket: it can
// never confirm, but its kernel reset the connection, so the sender gets
// receiver-closed evidence and the batch's doubt ends (without this, a dead
// decode's prefill ranks held their source pages forever).
func TestReceiverClosedAfterReceiverCrash(t *testing.T) {
	w := newStalledWrite(t, Config{AckTimeout: time.Minute})
	res, early, violation := w.quiesceAndWatch(w.signal(syscall.SIGKILL))
	if violation != nil {
		t.Fatal(violation)
	}
	if early {
		t.Fatalf("Quiesce gave %s evidence while the receiver was alive", res.Evidence)
	}
	if res.Evidence != sdk.EvidenceReceiverClosed {
		t.Fatalf("evidence after the receiver died: %q (%s), want %s", res.Evidence, res.Detail, sdk.EvidenceReceiverClosed)
	}
	t.Logf("receiver-closed %v after the kill: %s", w.evidenceAt.Sub(w.resumedAt), res.Detail)
	c, err := w.e.Wait(w.id)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status == sdk.Succeeded {
		t.Fatalf("unacknowledged write completed %v", c.Status)
	}
	if n := w.e.Count(w.id); n != 1 {
		t.Fatalf("%d completions for batch %d", n, w.id)
	}
	// Evidence for a batch that is already settled is vacuous.
	if r, err := w.s.Quiesce(context.Background(), w.e.Peer, []sdk.BatchID{w.id}); err != nil || r.Evidence != sdk.EvidenceCompletionsHarvested {
		t.Fatalf("second Quiesce: %+v, %v", r, err)
	}
}

// A test that cannot fail is a defect: the known-unsafe sender that closes
// its own side and calls that the receiver's close claims evidence while
// the receiver is alive, and the stalled write then lands after it.
func TestOwnCloseIsReceiverClosedIsCaught(t *testing.T) {
	w := newStalledWrite(t, Config{AckTimeout: time.Minute, unsafe: unsafeOwnCloseIsReceiverClosed})
	res, early, violation := w.quiesceAndWatch(w.signal(syscall.SIGCONT))
	if violation == nil {
		t.Fatalf("own-close-is-receiver-closed was not caught (evidence %s, first try %v)", res.Evidence, early)
	}
	if !early || res.Evidence != sdk.EvidenceReceiverClosed {
		t.Fatalf("unexpected shape: evidence %s, first try %v", res.Evidence, early)
	}
	t.Logf("caught as expected: %v", violation)
}

// Only the receiver's close counts: our own close, a timeout or an
// unreachable host never does, and a writer's EPIPE defers to the reader.
func TestClassifyClose(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("read tcp: %w", err) }
	cases := []struct {
		err     error
		reading bool
		want    closeKind
	}{
		{wrap(io.EOF), true, closeByPeer},
		{wrap(io.ErrUnexpectedEOF), true, closeByPeer},
		{wrap(syscall.ECONNRESET), true, closeByPeer},
		{wrap(syscall.ECONNRESET), false, closeByPeer},
		{wrap(net.ErrClosed), true, closeNeutral},
		{wrap(net.ErrClosed), false, closeNeutral},
		{wrap(syscall.EPIPE), false, closeNeutral},
		{wrap(syscall.ETIMEDOUT), true, closeFault},
		{wrap(syscall.ETIMEDOUT), false, closeFault},
		{wrap(syscall.EHOSTUNREACH), true, closeFault},
		{wrap(errDeadline), true, closeFault},
	}
	for _, c := range cases {
		if got := classifyClose(c.err, c.reading, false); got != c.want {
			t.Errorf("classifyClose(%v, reading=%v) = %d, want %d", c.err, c.reading, got, c.want)
		}
	}
	if classifyClose(wrap(net.ErrClosed), true, true) != closeByPeer {
		t.Error("the unsafe variant no longer misreads its own close")
	}
}

// procState is the state letter of a process in /proc (R, S, T, Z, ...), or
// 0 if it cannot be read.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// The receiver's side of receiver-closed evidence: once its close of a data
// connection is visible to the sender (end of stream or reset), not one more
// byte read from that connection lands. A write is cut halfway through its
// payload by a graceful Close of the receiving transport; the rest of the
// payload, sent after the sender saw the close, must not land.
func TestReceiverAppliesNothingAfterItsClose(t *testing.T) {
	ctx := context.Background()
	rcv, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = rcv.Close()
		}
	}()
	mem, err := sdk.NewSharedMemory("dst", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	region, err := rcv.RegisterMemory(ctx, mem.Desc())
	if err != nil {
		t.Fatal(err)
	}
	k, err := rcv.Grant(ctx, sdk.Window{Region: region, Length: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// A hand-driven sender: hello, then one write whose payload comes in
	// two halves.
	ep, err := rcv.LocalEndpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := dialAs(t, ep.Address, newTestIdentity(t), k)
	var hb [headerSize]byte
	const n, half = 64 << 10, 32 << 10
	payload := bytes.Repeat([]byte{0xAB}, n)
	(&header{Type: frameWrite, Seq: 1, Key: uint64(k), Length: n, Deadline: time.Now().Add(time.Minute).UnixNano()}).encode(hb[:])
	if _, err := c.Write(append(hb[:], payload[:half]...)); err != nil {
		t.Fatal(err)
	}
	dst := mem.Bytes()
	for deadline := time.Now().Add(30 * time.Second); dst[half-1] != 0xAB; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first half of the payload never landed")
		}
	}
	// The receiving transport closes gracefully while the payload's read
	// is in progress.
	done := make(chan error, 1)
	go func() { done <- rcv.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, rerr := c.Read(hb[:])
	if classifyClose(rerr, true, false) != closeByPeer {
		t.Fatalf("the sender saw %v, not the receiver's close", rerr)
	}
	// Seen from the sender, the connection is closed: the rest of the
	// payload must not land.
	_, _ = c.Write(payload[half:])
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !bytes.Equal(dst[half:n], make([]byte, n-half)) {
			t.Fatal("payload bytes landed after the receiver's close was visible to the sender")
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		closed = true
	case <-time.After(30 * time.Second):
		t.Fatal("the receiving transport's Close did not return")
	}
}

// TLS keeps a decrypted record in user space; a read after the receiver's
// close would hand out its rest without touching the socket. abort makes
// sure none is: the rest of a record already decrypted is never applied.
func TestAbortHandsOutNoBufferedRecord(t *testing.T) {
	srvID := newTestIdentity(t)
	ln, accepted := listenOnce(t)
	go func() {
		c := connectAs(t, pinnedAddress(ln.Addr().String(), srvID.fp), newTestIdentity(t))
		_, _ = c.Write(bytes.Repeat([]byte{0xAB}, 12<<10)) // one record
	}()
	raw := <-accepted
	defer raw.Close()
	conn := tls.Server(raw, srvID.serverTLS())
	s := &recvSession{raw: raw, conn: conn, done: make(chan struct{})}
	first := make([]byte, 4<<10)
	if err := s.readFull(first, time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	s.abort()
	rest := make([]byte, 8<<10)
	if err := s.readFull(rest, time.Now().Add(10*time.Second)); !errors.Is(err, errSessionEnded) {
		t.Fatalf("read after abort: %v, want errSessionEnded", err)
	}
	if !bytes.Equal(rest, make([]byte, len(rest))) {
		t.Fatal("bytes of a record decrypted before the close were handed out after it")
	}
}

// stopProcess stops pid with SIGSTOP, waits until it is stopped, and lets
// it run again at the end of the test.
func stopProcess(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill(2) returns before the process is stopped: wait until it is.
	for deadline := time.Now().Add(30 * time.Second); procState(pid) != 'T'; {
		if time.Now().After(deadline) {
			t.Fatalf("receiver %d not stopped (state %c)", pid, procState(pid))
		}
		time.Sleep(time.Millisecond)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
}
