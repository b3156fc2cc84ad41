package tcp

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/sdk"
)

// receiver is the listening side: it applies writes into granted windows.
type receiver struct {
	t        *Transport
	ln       net.Listener
	instance uint64 // random per process: a Quiesce for another incarnation is refused
	log      hclog.Logger

	mu          sync.Mutex
	sessions    map[uint64]*recvSession
	nextSession uint64
	closed      bool
	wg          sync.WaitGroup
}

// recvSession is one data connection from a sender. Its sender may take
// the end of the connection, seen from its side, as proof that nothing more
// of it is applied (sdk.EvidenceReceiverClosed, closed.go), so: a payload is
// read only straight into its window (never into a buffer to be applied
// later), and a session is ended only by a full close of its socket (never
// a half-close), which Go performs after a read in progress returns.
type recvSession struct {
	id   uint64
	conn net.Conn
	once sync.Once
	done chan struct{} // closed when its goroutine will apply nothing more
}

func (s *recvSession) abort() { s.once.Do(func() { _ = s.conn.Close() }) }

func (r *receiver) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.wg.Add(1)
		r.mu.Unlock()
		go func() {
			defer r.wg.Done()
			r.handle(c)
		}()
	}
}

// handle reads the first frame and dispatches: HELLO starts a data session,
// QUIESCE is a control request. Anything else is garbage.
func (r *receiver) handle(c net.Conn) {
	defer c.Close()
	var hb [headerSize]byte
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	h, err := decodeHeader(hb[:], r.t.cfg.MaxOpBytes)
	if err != nil {
		r.t.stats.add(statGarbage, 1)
		r.log.Warn("garbage on a new connection", "remote", c.RemoteAddr().String(), "error", err)
		return
	}
	switch h.Type {
	case frameHello:
		r.session(c)
	case frameQuiesce:
		r.quiesce(c, h)
	default:
		r.t.stats.add(statGarbage, 1)
	}
}

func (r *receiver) session(c net.Conn) {
	r.mu.Lock()
	r.nextSession++
	s := &recvSession{id: r.nextSession, conn: c, done: make(chan struct{})}
	r.sessions[s.id] = s
	r.mu.Unlock()
	defer func() {
		s.abort()
		r.mu.Lock()
		delete(r.sessions, s.id)
		r.mu.Unlock()
		close(s.done)
	}()
	var hb [headerSize]byte
	ack := header{Type: frameHelloAck, Key: r.instance, Offset: s.id}
	ack.encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		return
	}
	for {
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return
		}
		h, err := decodeHeader(hb[:], r.t.cfg.MaxOpBytes)
		if err != nil || h.Type != frameWrite {
			// A stream we cannot parse cannot be resynchronised: drop the
			// connection, count it, stay up. Unacknowledged writes on it
			// are InDoubt at the sender until it quiesces.
			r.t.stats.add(statGarbage, 1)
			r.log.Warn("garbage on a data connection; closing it", "session", s.id, "error", err)
			return
		}
		if r.t.cfg.unsafe == unsafeAckBeforeApply {
			if err := r.ackEarly(s, h); err != nil {
				return
			}
			continue
		}
		code, err := r.apply(s, h)
		if err != nil {
			return
		}
		reply := header{Type: frameAck, Code: uint16(code), Seq: h.Seq}
		if code == ackOK {
			reply.Length = h.Length
		}
		reply.encode(hb[:])
		// The acknowledgement goes out only after the bytes are in memory.
		if _, err := c.Write(hb[:]); err != nil {
			return
		}
	}
}

// ackEarly is the known-unsafe ack-before-apply receiver: it acknowledges a
// write as applied when its header arrives, and applies large payloads a
// little later, as a NIC that acks on receipt and DMAs afterwards would.
func (r *receiver) ackEarly(s *recvSession, h header) error {
	var hb [headerSize]byte
	(&header{Type: frameAck, Code: uint16(ackOK), Seq: h.Seq, Length: h.Length}).encode(hb[:])
	if _, err := s.conn.Write(hb[:]); err != nil {
		return err
	}
	if h.Length >= 64<<10 {
		time.Sleep(200 * time.Millisecond)
	}
	_, err := r.apply(s, h)
	return err
}

// apply validates one write and reads its payload straight from the socket
// into the mapped window. A refused write's payload is read and discarded so
// the stream stays in sync. An error means the connection is unusable.
func (r *receiver) apply(s *recvSession, h header) (ackCode, error) {
	r.t.mu.Lock()
	e := r.t.keys[sdk.Key(h.Key)]
	r.t.mu.Unlock()
	code := ackOK
	switch {
	case e == nil:
		code = ackUnknownKey
	case !inBounds(h.Offset, h.Length, e.length):
		code = ackOutOfBounds
	case time.Now().UnixNano() > h.Deadline:
		code = ackExpired
	case !e.begin(s, r.t.cfg.unsafe == unsafeApplyAfterRevoke):
		code = ackRevoked
	}
	if code != ackOK {
		r.t.stats.add(statDropped, 1)
		_, err := io.CopyN(io.Discard, s.conn, int64(h.Length))
		return code, err
	}
	// Never apply past the write's deadline: a payload still arriving then is
	// cut off (the read fails, the connection closes). Bounds MaxTail.
	_ = s.conn.SetReadDeadline(time.Unix(0, h.Deadline))
	dst := e.region.mem[e.off+h.Offset : e.off+h.Offset+h.Length]
	_, err := io.ReadFull(s.conn, dst)
	_ = s.conn.SetReadDeadline(time.Time{})
	e.end(s, err == nil)
	if err != nil {
		if errors.Is(err, errDeadline) {
			r.t.stats.add(statExpired, 1)
		}
		return code, err
	}
	r.t.stats.add(statApplied, 1)
	r.t.stats.add(statBytesApplied, h.Length)
	return ackOK, nil
}

// quiesce answers a sender's request: once we reply OK, the named session
// applies nothing more (its connection is closed and its goroutine is done).
func (r *receiver) quiesce(c net.Conn, h header) {
	reply := header{Type: frameQuiesced, Key: h.Key, Offset: h.Offset}
	if h.Key != r.instance {
		reply.Code = quiescedUnknownInstance
	} else {
		r.mu.Lock()
		s := r.sessions[h.Offset]
		r.mu.Unlock()
		switch {
		case s != nil && r.t.cfg.unsafe == unsafeConfirmBeforeStopped:
			// KNOWN-UNSAFE: ends only its sending side, so the sender sees
			// the close, while the session goes on reading and applying.
			if hc, ok := s.conn.(interface{ CloseWrite() error }); ok {
				_ = hc.CloseWrite()
			}
		case s != nil:
			s.abort()
			<-s.done
		}
	}
	var hb [headerSize]byte
	reply.encode(hb[:])
	_, _ = c.Write(hb[:])
}

// close stops listening and ends every session.
func (r *receiver) close() {
	r.mu.Lock()
	r.closed = true
	sessions := make([]*recvSession, 0, len(r.sessions))
	for _, s := range r.sessions {
		sessions = append(sessions, s)
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	for _, s := range sessions {
		s.abort()
	}
	r.wg.Wait()
}
