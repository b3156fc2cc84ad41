package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// errHelloRefused: the receiver opens no session for the key our HELLO
// named (unknown or revoked there: one answer, admission.go).
var errHelloRefused = errors.New("receiver: key not usable (unknown or revoked)")

// dialTimeout bounds the TCP connect, the TLS handshake and the hello.
const dialTimeout = 5 * time.Second

// open connects to the peer's receiver and proves both identities (TLS 1.3,
// the receiver's certificate pinned: identity.go). It returns the
// connection to use, its TCP socket, and the cork between them (cork.go;
// uncorked until the writer corks it). We close the socket, never the TLS
// connection: a TLS close first sends an alert, which can wait on a
// receiver that does not read.
func (s *sendSession) open(ctx context.Context) (conn, raw net.Conn, ck *corkedConn, err error) {
	d := net.Dialer{Timeout: dialTimeout}
	raw, err = d.DialContext(ctx, "tcp", s.peer.addr)
	if err != nil {
		return nil, nil, nil, err
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	ck = newCorkedConn(raw)
	if s.t.id == nil {
		return ck, raw, ck, nil // KNOWN-UNSAFE: the cleartext variant
	}
	tc := tls.Client(ck, s.t.id.clientTLS(s.peer.pin))
	hctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		_ = raw.Close()
		return nil, nil, nil, fmt.Errorf("tls handshake with %s: %w", s.peer.addr, err)
	}
	return tc, raw, ck, nil
}

// dialUsable dials until the receiver opens the session for a key our
// HELLO names. A refused HELLO fails only the batches that start with a
// refused key: those queued behind them (other requests, other keys) never
// left this process, so they get a HELLO of their own — one request's
// revoked key must not fail its neighbours (with eager revocation an
// aborted request's key is often revoked while its first batch dials).
func (s *sendSession) dialUsable(ctx context.Context) (net.Conn, net.Conn, *corkedConn, sessionToken, error) {
	for {
		conn, raw, ck, token, err := s.dial(ctx)
		if !errors.Is(err, errHelloRefused) || !s.nextHelloKey() {
			return conn, raw, ck, token, err
		}
	}
}

// nameHelloKeys picks the keys a HELLO names: the first batch's, and up to
// three more of other batches queued meanwhile, newest first (the least
// likely to belong to a request aborted since). Any one of them usable at
// the receiver opens the session. It moves the queue into held.
func (s *sendSession) nameHelloKeys() []sdk.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdQueued()
	s.named = append(s.named[:0], s.helloKey)
	for i := len(s.held) - 1; i >= 0 && len(s.named) < 4; i-- {
		if k := s.held[i].ops[0].RemoteKey; !slices.Contains(s.named, k) {
			s.named = append(s.named, k)
		}
	}
	return s.named
}

// holdQueued moves the queued batches into held, behind those already
// there. Caller holds s.mu (Post enqueues under it).
func (s *sendSession) holdQueued() {
	for {
		select {
		case b := <-s.queue:
			s.held = append(s.held, b)
		default:
			return
		}
	}
}

// nextHelloKey fails the queued batches whose first op names a refused
// key and takes the key of the oldest batch left for the next HELLO. With
// none left it reports false, and the session takes no more batches: it is
// marked broken under the lock Post enqueues under, so no batch slips in
// between. Every attempt fails at least one batch, so the dials end.
func (s *sendSession) nextHelloKey() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdQueued()
	kept := s.held[:0]
	for _, b := range s.held {
		if !slices.Contains(s.named, b.ops[0].RemoteKey) {
			kept = append(kept, b)
			continue
		}
		s.unpinFrom(b, 0)
		s.resolveUnsentClass(b, len(b.ops), classOfAck(ackRevoked), "dial failed: "+errHelloRefused.Error())
	}
	clear(s.held[len(kept):])
	s.held = kept
	if len(kept) == 0 {
		s.broken = errHelloRefused
		return false
	}
	s.helloKey = kept[0].ops[0].RemoteKey
	return true
}

// beforeHello runs before each HELLO is written, once its keys are named;
// tests hold a dial there.
var beforeHello = func() {}

// dial opens the data connection and says hello; the receiver answers with
// our session's token.
func (s *sendSession) dial(ctx context.Context) (net.Conn, net.Conn, *corkedConn, sessionToken, error) {
	conn, raw, ck, err := s.open(ctx)
	if err != nil {
		return nil, nil, nil, sessionToken{}, err
	}
	// Cancelling ctx ends the hello too: the socket is closed under it.
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	var hb [headerSize]byte
	hello := header{Type: frameHello}
	hello.setHelloKeys(s.nameHelloKeys())
	beforeHello()
	hello.encode(hb[:])
	_ = raw.SetDeadline(time.Now().Add(dialTimeout))
	if _, err := conn.Write(hb[:]); err != nil {
		raw.Close()
		return nil, nil, nil, sessionToken{}, err
	}
	if _, err := io.ReadFull(conn, hb[:]); err != nil {
		raw.Close()
		return nil, nil, nil, sessionToken{}, err
	}
	_ = raw.SetDeadline(time.Time{})
	h, err := decodeHeader(hb[:], 0)
	if err != nil || h.Type != frameHelloAck {
		raw.Close()
		return nil, nil, nil, sessionToken{}, fmt.Errorf("bad hello reply: %v", err)
	}
	if h.Code == helloRefused {
		raw.Close()
		return nil, nil, nil, sessionToken{}, errHelloRefused
	}
	return conn, raw, ck, h.token(), nil
}

// askReceiver opens a second connection, as the same identity, and asks
// the receiver to end our session there; it returns nil only on the
// receiver's confirmation. A receiver that is not the pinned one (another
// incarnation on the address) fails the handshake: no confirmation.
func (s *sendSession) askReceiver(ctx context.Context, token sessionToken) error {
	c, raw, _, err := s.open(ctx)
	if err != nil {
		return errdefs.Errorf(errdefs.Unavailable, "Quiesce: receiver unreachable or not the pinned one: %v", err)
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	var hb [headerSize]byte
	q := header{Type: frameQuiesce}
	q.setToken(token)
	q.encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		return errdefs.Errorf(errdefs.Unavailable, "Quiesce: %v", err)
	}
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return errdefs.Errorf(errdefs.Unavailable, "Quiesce: no confirmation: %v", err)
	}
	h, err := decodeHeader(hb[:], 0)
	if err != nil || h.Type != frameQuiesced {
		return errdefs.Errorf(errdefs.Internal, "Quiesce: bad confirmation: %v", err)
	}
	if h.Code != quiescedOK {
		return errdefs.Errorf(errdefs.Internal, "Quiesce: the receiver says the session is not ours")
	}
	return nil
}
