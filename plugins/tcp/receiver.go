package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/sdk"
)

// maxUnknownKeyWrites: a session that sends this many writes under keys
// this receiver never granted is closed. An honest sender meets unknown
// keys only around a deregistration; a stream of them is someone guessing.
const maxUnknownKeyWrites = 256

// ackWriteTimeout bounds how long the receiver waits to hand an
// acknowledgement to a sender that does not read them.
const ackWriteTimeout = 30 * time.Second

// receiver is the listening side: it applies writes into granted windows.
type receiver struct {
	t   *Transport
	ln  net.Listener
	id  *identity   // nil in the cleartext variant
	tls *tls.Config // server side of id
	log hclog.Logger

	mu       sync.Mutex
	sessions map[sessionToken]*recvSession
	present  map[fingerprint]*presence // identities with a session open
	conns    map[net.Conn]*admitted    // every accepted connection still open (admission.go)
	refusals *refusalLog               // bounded logging of refusals (admission.go)
	closed   bool
	stop     chan struct{} // closed by close: ends the accept backoff
	wg       sync.WaitGroup
}

// sessionToken names a data session to its sender (HELLO_ACK) and to the
// sender's Quiesce; 128 random bits, never sent outside the session's TLS.
type sessionToken [16]byte

func newSessionToken() sessionToken {
	var t sessionToken
	randomFill(t[:])
	return t
}

// presence is one span of time during which an identity has at least one
// data session open here. A writer-bound key is bound to the presence its
// writer had at Grant: any of the writer's connections may use it while
// one of them stays open, and it dies with the last one (a reconnection
// starts a new presence). Guarded by receiver.mu.
type presence struct{ live int }

// recvSession is one data connection from a sender. Its sender may take
// the end of the connection, seen from its side, as proof that nothing more
// of it is applied (sdk.EvidenceReceiverClosed, closed.go), so: a payload is
// read only straight into its window (never into a buffer to be applied
// later), and a session is ended only by a full close of its socket (never
// a half-close), and only once no read of it is in progress (abort).
type recvSession struct {
	token sessionToken
	peer  fingerprint // the sender's proven identity
	at    *presence   // its identity's presence, which it keeps alive
	raw   net.Conn    // the TCP socket
	conn  net.Conn    // TLS over raw (raw itself in the cleartext variant)

	// readMu is held around every read of conn. The TLS layer keeps up to
	// one decrypted record that a later read hands out without touching
	// the socket; abort takes readMu before closing the socket so that no
	// such byte is applied after the close is visible to the sender.
	readMu sync.Mutex
	dead   atomic.Bool // abort has begun; no read starts
	rdl    time.Time   // under readMu: the read deadline last set here
	once   sync.Once
	done   chan struct{} // closed when its goroutine will apply nothing more

	unknownKeys int // only its goroutine
	wroteFlag       // set at its first write: no longer silent (admission.go)
}

var (
	errSessionEnded = errors.New("session ended")
	// errRefusalCutSession ends a session at a refused write: only the
	// known-unsafe variant refusal-cuts-session does that.
	errRefusalCutSession = errors.New("a refused write cut its session (unsafe variant)")
	aLongTimeAgo         = time.Unix(1, 0)
)

// Test hooks on the race between abort and a read about to start:
// beforeReadDeadline runs in readFull with readMu held, past its check that
// the session is not aborted, before it sets its read deadline;
// afterAbortDeadline runs in abort after the past deadline is set, before
// abort takes readMu.
var (
	beforeReadDeadline = func(*recvSession, time.Time) {}
	afterAbortDeadline = func(*recvSession) {}
)

// abort ends the session: a read in progress is woken by a past deadline
// (not by a close, which would send FIN before the read's last copy), no
// read starts after, and only then is the socket closed. dead is set before
// the past deadline: a read about to start may set its own deadline over
// ours (readFull), and then sees dead instead of blocking until its own.
func (s *recvSession) abort() {
	s.once.Do(func() {
		s.dead.Store(true)
		_ = s.raw.SetReadDeadline(aLongTimeAgo)
		afterAbortDeadline(s)
		s.readMu.Lock()
		_ = s.raw.Close()
		s.readMu.Unlock()
	})
}

// readFull fills p from the connection, failing at deadline (zero: none).
func (s *recvSession) readFull(p []byte, deadline time.Time) error {
	for len(p) > 0 {
		s.readMu.Lock()
		if s.dead.Load() {
			s.readMu.Unlock()
			return errSessionEnded
		}
		// The records of one payload share a deadline: set it once. An
		// abort that began since the check above may have set its past
		// deadline before ours replaced it; it set dead first, so look
		// again, or this read would wait for our deadline (IdleTimeout
		// between frames), with abort — and a Quiesce — waiting on readMu.
		beforeReadDeadline(s, deadline)
		if !deadline.Equal(s.rdl) {
			_ = s.raw.SetReadDeadline(deadline)
			s.rdl = deadline
			if s.dead.Load() {
				s.readMu.Unlock()
				return errSessionEnded
			}
		}
		n, err := s.conn.Read(p)
		s.readMu.Unlock()
		p = p[n:]
		switch {
		case err == nil || len(p) == 0:
		case errors.Is(err, io.EOF):
			return io.ErrUnexpectedEOF
		default:
			return err
		}
	}
	return nil
}

// discard reads and drops n bytes (a refused write's payload).
func (s *recvSession) discard(n uint64, deadline time.Time) error {
	var buf [16 << 10]byte
	for n > 0 {
		m := uint64(len(buf))
		if n < m {
			m = n
		}
		if err := s.readFull(buf[:m], deadline); err != nil {
			return err
		}
		n -= m
	}
	return nil
}

func (s *recvSession) write(b []byte) error {
	_ = s.raw.SetWriteDeadline(time.Now().Add(ackWriteTimeout))
	_, err := s.conn.Write(b)
	return err
}

// serve accepts until the listener closes. A failed Accept (out of file
// descriptors, out of memory) is counted and retried with backoff: the data
// port must outlive a burst of exhaustion.
func (r *receiver) serve() {
	var backoff time.Duration
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.t.stats.add(statAcceptErrors, 1)
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			r.log.Warn("accept failed; retrying", "error", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
				continue
			case <-r.stop:
				return
			}
		}
		backoff = 0
		r.mu.Lock()
		switch {
		case r.closed:
			r.mu.Unlock()
			_ = c.Close()
			return
		case !r.admitLocked(c):
			r.mu.Unlock()
			r.t.stats.add(statConnsRefused, 1)
			_ = c.Close()
			continue
		}
		r.wg.Add(1)
		r.mu.Unlock()
		go func() {
			defer r.wg.Done()
			r.handle(c)
			r.mu.Lock()
			delete(r.conns, c)
			r.mu.Unlock()
		}()
	}
}

// handle authenticates the connection and reads its first frame: HELLO
// starts a data session, QUIESCE asks to end one. Anything else is garbage.
func (r *receiver) handle(raw net.Conn) {
	defer raw.Close()
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	deadline := time.Now().Add(r.t.cfg.HandshakeTimeout)
	_ = raw.SetDeadline(deadline)
	conn, peer, err := r.authenticate(raw, deadline)
	if err != nil {
		r.t.stats.add(statHandshakeFail, 1)
		r.log.Debug("data connection not authenticated", "remote", raw.RemoteAddr().String(), "error", err)
		return
	}
	var hb [headerSize]byte
	if _, err := io.ReadFull(conn, hb[:]); err != nil {
		return
	}
	_ = raw.SetDeadline(time.Time{})
	h, err := decodeHeader(hb[:], r.t.cfg.MaxOpBytes)
	if err != nil {
		r.t.stats.add(statGarbage, 1)
		r.refusals.warn(r, "garbage on a new connection", "remote", raw.RemoteAddr().String(), "error", err)
		return
	}
	switch h.Type {
	case frameHello:
		if !r.helloAnyUsable(peer, h.helloKeys()) {
			r.refuseHello(conn, peer)
			return
		}
		r.session(raw, conn, peer)
	case frameQuiesce:
		r.quiesce(conn, peer, h)
	default:
		r.t.stats.add(statGarbage, 1)
	}
}

// authenticate runs the TLS handshake and returns the connection to use
// and the client's proven fingerprint.
func (r *receiver) authenticate(raw net.Conn, deadline time.Time) (net.Conn, fingerprint, error) {
	if r.id == nil {
		return raw, fingerprint{}, nil // KNOWN-UNSAFE: the cleartext variant
	}
	tc := tls.Server(raw, r.tls)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fingerprint{}, err
	}
	fp, err := peerFingerprint(tc.ConnectionState())
	return tc, fp, err
}

// refuseHello answers a HELLO whose key is not usable here; the same
// answer whatever the reason (admission.go).
func (r *receiver) refuseHello(conn net.Conn, peer fingerprint) {
	r.t.stats.add(statHelloRefused, 1)
	r.refusals.warn(r, "refused a data session: its HELLO names no key usable here", "identity", peer.String())
	var hb [headerSize]byte
	(&header{Type: frameHelloAck, Code: helloRefused}).encode(hb[:])
	_, _ = conn.Write(hb[:])
}

// open registers a new session for peer, nil when the receiver is closing
// or the identity holds its most sessions (admission.go).
func (r *receiver) open(raw, conn net.Conn, peer fingerprint) *recvSession {
	s := &recvSession{token: newSessionToken(), peer: peer, raw: raw, conn: conn, done: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	if !r.joinLocked(s) {
		r.t.stats.add(statSessionsCapped, 1)
		r.refusals.warn(r, "refused a data session: its identity holds the most sessions allowed", "identity", peer.String(), "max", r.t.cfg.MaxSessionsPerWriter)
		return nil
	}
	return s
}

func (r *receiver) session(raw, conn net.Conn, peer fingerprint) {
	s := r.open(raw, conn, peer)
	if s == nil {
		return
	}
	defer func() {
		s.abort()
		r.mu.Lock()
		delete(r.sessions, s.token)
		if s.at.live--; s.at.live == 0 {
			delete(r.present, peer)
		}
		r.mu.Unlock()
		close(s.done)
	}()
	var hb [headerSize]byte
	ack := header{Type: frameHelloAck}
	ack.setToken(s.token)
	ack.encode(hb[:])
	if err := s.write(hb[:]); err != nil {
		return
	}
	acks := startAckWriter(s)
	defer acks.end() // deferred after the abort, runs before it: queued acknowledgements leave first
	var held heldAcks
	defer func() { _ = held.release(s, acks, false) }() // runs first: held ones join the queue
	for {
		if err := s.readFull(hb[:], r.firstWriteDeadline(s)); err != nil {
			if errors.Is(err, errDeadline) {
				r.t.stats.add(statIdleClosed, 1)
			}
			return
		}
		s.wrote.Store(true)
		h, err := decodeHeader(hb[:], r.t.cfg.MaxOpBytes)
		if err != nil || h.Type != frameWrite {
			// A stream we cannot parse cannot be resynchronised: drop the
			// connection, count it, stay up. Unacknowledged writes on it
			// are InDoubt at the sender until it quiesces.
			r.t.stats.add(statGarbage, 1)
			r.refusals.warn(r, "garbage on a data connection; closing it", "error", err)
			return
		}
		if r.t.cfg.unsafe == unsafeAckBeforeApply {
			if err := r.ackEarly(s, acks, h); err != nil {
				return
			}
			continue
		}
		large := h.Length >= ackAtOnceBytes
		if !held.roomFor(h.Length) && held.release(s, acks, large) != nil {
			return
		}
		code, err := r.apply(s, h)
		if err != nil {
			return
		}
		reply := header{Type: frameAck, Code: uint16(oneAnswer(code)), Seq: h.Seq}
		if code == ackOK {
			reply.Length = h.Length
		}
		// The acknowledgement goes out only after the bytes are in memory,
		// and once the sender needs it (acks.go): after a write it has
		// nothing queued behind, or when the hold is full.
		if full := held.hold(reply, h.Length); full || h.Code&writeAckNow != 0 {
			if held.release(s, acks, large) != nil {
				return
			}
		}
		if code == ackUnknownKey {
			if s.unknownKeys++; s.unknownKeys >= maxUnknownKeyWrites {
				r.t.stats.add(statGuessesClosed, 1)
				r.refusals.warn(r, "closing a data session that keeps writing under unknown keys", "writes", s.unknownKeys)
				return
			}
		}
	}
}

// ackEarly is the known-unsafe ack-before-apply receiver: it acknowledges a
// write as applied when its header arrives, and applies large payloads a
// little later, as a NIC that acks on receipt and DMAs afterwards would.
func (r *receiver) ackEarly(s *recvSession, acks *ackWriter, h header) error {
	if err := acks.push(header{Type: frameAck, Code: uint16(ackOK), Seq: h.Seq, Length: h.Length}); err != nil {
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
	case e.writer != nil && e.writer != s.at:
		code = ackNotWriter
		r.t.stats.add(statNotWriter, 1)
	case !e.admits(h.Offset, h.Length, r.t.cfg.unsafe == unsafeIgnorePieces):
		code = ackOutOfBounds
	case time.Now().UnixNano() > h.Deadline:
		code = ackExpired
	case !e.begin(s, r.t.cfg.unsafe == unsafeApplyAfterRevoke):
		code = ackRevoked
	}
	deadline := time.Unix(0, h.Deadline)
	if code != ackOK {
		r.t.stats.add(statDropped, 1)
		if r.t.cfg.unsafe == unsafeRefusalCutsSession {
			return code, errRefusalCutSession
		}
		return code, s.discard(h.Length, deadline)
	}
	// Never apply past the write's deadline: a payload still arriving then is
	// cut off (the read fails, the connection closes). Bounds MaxTail.
	dst := e.region.mem[e.off+h.Offset : e.off+h.Offset+h.Length]
	err := s.readFull(dst, deadline)
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
// applies nothing more (its connection is closed and its goroutine is
// done). Only the identity that opened the session may end it; a token
// this incarnation does not know names no session that can apply anything.
func (r *receiver) quiesce(c net.Conn, peer fingerprint, h header) {
	reply := header{Type: frameQuiesced}
	r.mu.Lock()
	s := r.sessions[h.token()]
	r.mu.Unlock()
	switch {
	case s == nil:
	case !s.peer.equal(peer):
		reply.Code = quiescedRefused
		r.t.stats.add(statQuiesceRefused, 1)
		r.refusals.warn(r, "refused a Quiesce for another identity's session", "from", peer.String())
	case r.t.cfg.unsafe == unsafeConfirmBeforeStopped:
		// KNOWN-UNSAFE: half-closes the TCP socket, so the sender sees the
		// end of the stream at once, while the session goes on reading and
		// applying. It shuts the socket itself down: a TLS CloseWrite only
		// queues a close_notify record, which waits behind whatever stalls
		// the link, and by the time it arrives (or the sender gives up on it)
		// the stalled writes are past their deadlines and refused — a
		// variant that only looks unsafe.
		if tc, ok := s.raw.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	default:
		s.abort()
		<-s.done
	}
	var hb [headerSize]byte
	reply.encode(hb[:])
	_, _ = c.Write(hb[:])
}

// presenceOf is fp's current presence, nil if it has no session open.
func (r *receiver) presenceOf(fp fingerprint) *presence {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.present[fp]
}

// close stops listening and ends every connection.
func (r *receiver) close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
	}
	sessions := make([]*recvSession, 0, len(r.sessions))
	for _, s := range r.sessions {
		sessions = append(sessions, s)
	}
	var handshaking []net.Conn
	for c := range r.conns {
		handshaking = append(handshaking, c)
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	isSession := map[net.Conn]bool{}
	for _, s := range sessions {
		isSession[s.raw] = true
		s.abort()
	}
	for _, c := range handshaking {
		// A session's socket is closed by its abort only (see abort);
		// no connection becomes a session once closed is set.
		if !isSession[c] {
			_ = c.Close()
		}
	}
	r.wg.Wait()
}
