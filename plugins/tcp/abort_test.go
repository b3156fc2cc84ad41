package tcp

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// listenOnce listens on loopback and hands over the first connection it
// accepts.
func listenOnce(t testing.TB) (net.Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	return ln, accepted
}

// tcpPair is a connected pair of loopback TCP sockets.
func tcpPair(t *testing.T) (near, far net.Conn) {
	t.Helper()
	ln, accepted := listenOnce(t)
	far, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	near = <-accepted
	t.Cleanup(func() { _ = near.Close(); _ = far.Close() })
	return near, far
}

// An abort that begins while the session's goroutine is between reads
// (it holds readMu, past its dead check, about to set the next read's
// deadline) must still end that read at once. The receiver's Quiesce
// answers only after abort returns, and its sender keeps the connection
// open until that answer: a read that set its own deadline over abort's
// past one blocked until that deadline (IdleTimeout, 5 minutes, for the
// next frame header), and abort with it — the sender's Quiesce hung for
// its whole context (TestContractOutOfProcess/quiesce-gives-evidence, 150 s
// on a loaded CI machine). The read here is given a deadline instead of
// IdleTimeout, so the old code fails with that deadline rather than hangs.
func TestAbortEndsAReadAboutToStart(t *testing.T) {
	raw, _ := tcpPair(t) // the far end never writes: only abort ends the read
	s := &recvSession{raw: raw, conn: raw, done: make(chan struct{})}
	reading := make(chan struct{})  // readFull holds readMu, about to set its deadline
	aborting := make(chan struct{}) // abort set its past deadline
	beforeReadDeadline = func(hs *recvSession, _ time.Time) {
		if hs == s {
			close(reading)
			<-aborting
		}
	}
	afterAbortDeadline = func(hs *recvSession) {
		if hs == s {
			close(aborting)
		}
	}
	t.Cleanup(func() {
		beforeReadDeadline = func(*recvSession, time.Time) {}
		afterAbortDeadline = func(*recvSession) {}
	})
	readErr := make(chan error, 1)
	go func() {
		var b [headerSize]byte
		readErr <- s.readFull(b[:], time.Now().Add(5*time.Second))
	}()
	<-reading
	aborted := make(chan struct{})
	go func() {
		s.abort() // sets its past deadline, then waits for readMu
		close(aborted)
	}()
	err := <-readErr
	<-aborted
	if errors.Is(err, errDeadline) {
		t.Fatalf("readFull after abort began: %v — it overwrote abort's past deadline with its own and blocked until it", err)
	}
	if !errors.Is(err, errSessionEnded) {
		t.Fatalf("readFull after abort began: %v, want %v", err, errSessionEnded)
	}
}

// The same race end to end: the receiver's data session applied every
// write it was sent and is about to set the next header's deadline when the
// sender's Quiesce begins to abort it (the hooks hold it there, and hold the
// acknowledgements, so that the batches are still open and Quiesce asks the
// receiver). With the old readFull the session then waited for the next
// header under its own idle deadline, abort waited for it, and the receiver
// never confirmed: Quiesce failed only when its context ran out (here 2
// minutes; 150 s in the CI run's TestContractOutOfProcess).
func TestQuiesceWhileReceiverIsBetweenWrites(t *testing.T) {
	const idle, writes = 10 * time.Minute, 4
	send, recv := newTCP(t, Config{}), newTCP(t, Config{IdleTimeout: idle})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: send, Receiver: recv})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Length: writes * 4096})
	if err != nil {
		t.Fatal(err)
	}
	held, abortBegan := holdBetweenWrites(t, recv, idle, writes)
	var ids []sdk.BatchID
	for i := uint64(0); i < writes; i++ {
		id := e.NewBatchID()
		if err := send.Post(ctx, e.Write(id, k, i*4096, i*4096, 4096)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	<-held // every write applied, none acknowledged
	res, err := send.Quiesce(ctx, e.Peer, ids)
	if err != nil {
		t.Fatalf("Quiesce with the receiver between writes: %v", err)
	}
	select {
	case <-abortBegan:
	default:
		t.Fatalf("Quiesce (%s) did not abort the receiver's session: the test did not set up the race", res.Evidence)
	}
	for _, id := range ids {
		if _, err := e.Wait(id); err != nil {
			t.Fatal(err) // Quiesce's evidence covers every batch: each is completed
		}
	}
}

// holdBetweenWrites holds recv's data session once it applied n writes,
// before it sets the next header's deadline (idle away), and holds every
// acknowledgement, until an abort of that session has set its past
// deadline. held is closed when the session is held; abortBegan when the
// abort began.
func holdBetweenWrites(t *testing.T, recv *Transport, idle time.Duration, n uint64) (held, abortBegan chan struct{}) {
	applied := func() uint64 { return recv.stats.snapshot()[statApplied] }
	last := applied() + n
	var session atomic.Pointer[recvSession]
	var once sync.Once
	held, abortBegan = make(chan struct{}), make(chan struct{})
	testOver := make(chan struct{})
	hold := func() {
		select {
		case <-abortBegan:
		case <-testOver:
		}
	}
	beforeAckWrite = func(*recvSession) { hold() }
	beforeReadDeadline = func(s *recvSession, dl time.Time) {
		if time.Until(dl) > idle/2 && applied() >= last && session.CompareAndSwap(nil, s) {
			close(held)
			hold()
		}
	}
	afterAbortDeadline = func(s *recvSession) {
		if session.Load() == s {
			once.Do(func() { close(abortBegan) })
		}
	}
	t.Cleanup(func() {
		beforeAckWrite = func(*recvSession) {}
		beforeReadDeadline = func(*recvSession, time.Time) {}
		afterAbortDeadline = func(*recvSession) {}
		close(testOver)
		if s := session.Load(); s != nil {
			_ = s.raw.Close() // frees the old code's blocked read for Close
		}
	})
	return held, abortBegan
}
