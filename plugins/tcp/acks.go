package tcp

import "sync"

// ackBacklog bounds the acknowledgements a session holds for a sender that
// does not read them: past it, the session stops applying until they are
// written (as when it wrote each one itself), so the backlog cannot grow
// (at most ackBacklog queued, and as much again being written).
const ackBacklog = 64 << 10

// ackAtOnceBytes: held acknowledgements released by a write at least this
// large are written by the session itself, at once: they are far enough
// apart that waking the ack writer for them costs more CPU than coalescing
// saves (BenchmarkSmallOps: a loss at 64 KiB writes, a large gain at 4 KiB).
const ackAtOnceBytes = 32 << 10

// A receiving session holds the acknowledgements of the writes it applied
// until its sender needs them: the sender marks each write it has nothing
// queued behind (writeAckNow: the end of a batch, wire.go), and that write
// releases what is held, its own acknowledgement included. A sender that
// streams batches back to back gets one record of acknowledgements per run
// instead of one per write (each a system call, a packet and a wakeup at
// both ends: BenchmarkVsRawTLS). Whatever the sender marks, the hold is
// bounded: at most ackHoldCount acknowledgements, and the writes they
// acknowledge with the one being read at most ackHoldBytes (past it, what
// is held leaves before the next payload is read), so an acknowledgement
// waits for no more than about ackHoldBytes of further payload. It is
// always sent only after its write's bytes are in memory.
const (
	ackHoldCount = 64
	ackHoldBytes = 1 << 20
)

// heldAcks are a session's acknowledgements not yet released; only its
// goroutine touches them.
type heldAcks struct {
	frames []byte // encoded ACK frames
	n      int
	bytes  uint64 // payload bytes of the writes they acknowledge
}

// hold adds the acknowledgement of a write of n bytes; it reports whether
// the hold is full.
func (h *heldAcks) hold(reply header, n uint64) bool {
	h.frames = reply.encodeTo(h.frames)
	h.n++
	h.bytes += n
	return h.n >= ackHoldCount || h.bytes >= ackHoldBytes
}

// roomFor reports whether a write of n bytes may be read with the held
// acknowledgements still held.
func (h *heldAcks) roomFor(n uint64) bool { return h.n == 0 || h.bytes+n <= ackHoldBytes }

// release sends what is held: written by the session at once, or through
// the ack writer with whatever else queues up meanwhile.
func (h *heldAcks) release(s *recvSession, a *ackWriter, atOnce bool) error {
	if h.n == 0 {
		return nil
	}
	var err error
	if atOnce {
		err = s.write(h.frames)
	} else {
		err = a.pushFrames(h.frames)
	}
	h.frames, h.n, h.bytes = h.frames[:0], 0, 0
	return err
}

// ackWriter sends a receiving session's acknowledgements from its own
// goroutine. The session queues an acknowledgement only once the write's
// bytes are in memory (or it refused the write) and goes on reading; the
// acknowledgements that queue up while one TLS write is in flight leave
// together in the next (one record, one system call, instead of one each).
type ackWriter struct {
	s *recvSession

	mu     sync.Mutex
	room   *sync.Cond // signalled when the backlog shrinks or writing failed
	buf    []byte     // encoded frames not yet handed to the connection
	failed error
	ending bool
	wake   chan struct{} // capacity 1: there is something to write or to end
	done   chan struct{} // closed when the goroutine returned
}

// beforeAckWrite runs before the ack writer hands acknowledgements to the
// connection; tests hold them back with it.
var beforeAckWrite = func(*recvSession) {}

func startAckWriter(s *recvSession) *ackWriter {
	a := &ackWriter{s: s, wake: make(chan struct{}, 1), done: make(chan struct{})}
	a.room = sync.NewCond(&a.mu)
	go a.run()
	return a
}

// push queues one frame. It blocks while the backlog is full and fails
// once a write failed (the session then ends).
func (a *ackWriter) push(h header) error {
	var hb [headerSize]byte
	h.encode(hb[:])
	return a.pushFrames(hb[:])
}

// pushFrames queues encoded frames (at most ackBacklog bytes), as push.
func (a *ackWriter) pushFrames(frames []byte) error {
	a.mu.Lock()
	for len(a.buf) > 0 && len(a.buf)+len(frames) > ackBacklog && a.failed == nil {
		a.room.Wait()
	}
	if err := a.failed; err != nil {
		a.mu.Unlock()
		return err
	}
	a.buf = append(a.buf, frames...)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return nil
}

// end writes what is still queued and stops the goroutine.
func (a *ackWriter) end() {
	a.mu.Lock()
	a.ending = true
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	<-a.done
}

func (a *ackWriter) run() {
	defer close(a.done)
	var out []byte
	for range a.wake {
		a.mu.Lock()
		out, a.buf = a.buf, out[:0]
		ending := a.ending
		a.room.Broadcast()
		a.mu.Unlock()
		if len(out) > 0 {
			beforeAckWrite(a.s)
			if err := a.s.write(out); err != nil {
				a.mu.Lock()
				a.failed = err
				a.room.Broadcast()
				a.mu.Unlock()
				// The sender cannot be told; end the session (its reader
				// sees the abort).
				a.s.abort()
				return
			}
		}
		if ending {
			return
		}
	}
}
