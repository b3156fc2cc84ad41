package tcp

import "sync"

// ackBacklog bounds the acknowledgements a session holds for a sender that
// does not read them: past it, the session stops applying until they are
// written (as when it wrote each one itself), so the backlog cannot grow
// (at most ackBacklog queued, and as much again being written).
const ackBacklog = 64 << 10

// ackAtOnceBytes: a write at least this large is acknowledged by the
// session itself, at once: its acknowledgements are far enough apart that
// waking the ack writer for each costs more CPU than coalescing saves
// (BenchmarkSmallOps: a loss at 64 KiB writes, a large gain at 4 KiB).
const ackAtOnceBytes = 32 << 10

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
	a.mu.Lock()
	for len(a.buf)+headerSize > ackBacklog && a.failed == nil {
		a.room.Wait()
	}
	if err := a.failed; err != nil {
		a.mu.Unlock()
		return err
	}
	a.buf = h.encodeTo(a.buf)
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
