package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/kvfence/kvfence/errdefs"
)

// This file: fair shares of the control port (issue 19). A connection is
// first pending (its TLS handshake under way), then authenticated as the
// SHA-256 of its leaf certificate. Both pools are capped, and what a peer
// can hold is bounded per certificate, so that a flood — strangers that
// never finish a handshake, or one valid certificate opening connections
// as fast as it can — leaves room for every honest peer:
//   - pending: at most Limits.MaxConns; at the cap the oldest pending
//     connection that has sent nothing is closed for the new one, else the
//     oldest pending one (a silent connection cannot hold the port against
//     one that arrives later, nor cut off a handshake under way while a
//     silent one is left);
//   - authenticated: at most Limits.MaxConns; at most MaxConnsPerIdentity
//     per certificate, a new one displacing (and closing) that
//     certificate's oldest; after ConnBurst, ConnRate new connections a
//     second per certificate (a handshake over the rate fails);
//   - router links: MaxRouters in all, MaxRoutersPerIdentity per
//     certificate; one that receives no frame for RouterIdleTimeout is
//     dropped (routers send a keepalive every routerKeepalive); commands are
//     read at most CommandRate a second per certificate, beyond CommandBurst
//     the reader waits (flow control pushes back on the router).
//
// Without TLS there are no identities: only the pool caps apply.
//
// Limits.oldAdmission is a test-only control arm: a port without
// per-certificate shares (one pool of MaxConns, further connections wait in
// the backlog; router links capped in all only, never idle; commands
// unlimited), which the flood test must catch.

// certID is the SHA-256 of a peer's leaf certificate.
type certID [sha256.Size]byte

// admission is a control server's bookkeeping of connections and router
// links.
type admission struct {
	lim Limits
	log hclog.Logger

	mu          sync.Mutex
	pending     map[*admConn]struct{}
	authed      int
	byID        map[certID]*idState
	routers     int
	evicted     atomic.Uint64 // pending connections closed for a newer one
	displace    atomic.Uint64 // authenticated connections displaced by their certificate's newer one
	refused     atomic.Uint64 // connections refused: pool full or over the certificate's rate
	most        int           // under mu: the most authenticated connections one certificate held
	mostRouters int           // under mu: the most router links one certificate held
	every       rate.Sometimes
}

// idState is what one certificate holds.
type idState struct {
	conns    []*admConn // oldest first
	routers  int
	connRate *rate.Limiter
	cmdRate  *rate.Limiter // shared by its router links
}

func newAdmission(lim Limits, log hclog.Logger) *admission {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &admission{lim: lim, log: log, pending: map[*admConn]struct{}{}, byID: map[certID]*idState{},
		every: rate.Sometimes{Interval: time.Second}}
}

// warn logs at most once a second; the counters keep every event.
func (a *admission) warn(msg string, args ...any) {
	a.every.Do(func() { a.log.Warn(msg+" (logged at most once a second)", args...) })
}

func (a *admission) idLocked(id certID) *idState {
	s := a.byID[id]
	if s == nil {
		s = &idState{connRate: rate.NewLimiter(rate.Limit(a.lim.ConnRate), a.lim.ConnBurst),
			cmdRate: rate.NewLimiter(rate.Limit(a.lim.CommandRate), a.lim.CommandBurst)}
		a.byID[id] = s
	}
	return s
}

// forgetLocked drops a certificate's state once it holds nothing and its
// rates have recovered, so the map stays as small as the live peers.
func (a *admission) forgetLocked(id certID, s *idState) {
	if len(s.conns) == 0 && s.routers == 0 && s.connRate.Tokens() >= float64(a.lim.ConnBurst) {
		delete(a.byID, id)
	}
}

// admConn is one accepted control connection.
type admConn struct {
	net.Conn
	a     *admission
	since time.Time
	id    *certID // nil until authenticated (or without TLS)
	// counted: under admission.mu, it counts in the authenticated pool
	// (and its certificate's connections). A displaced connection stops
	// counting at once, before it is closed, so that two newcomers never
	// displace the same one.
	counted bool
	closed  atomic.Bool
	spoke   atomic.Bool // a byte arrived: its handshake began
}

func (c *admConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.spoke.Load() {
		c.spoke.Store(true)
	}
	return n, err
}

func (c *admConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.a.release(c)
	}
	return c.Conn.Close()
}

func (a *admission) release(c *admConn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.pending[c]; ok {
		delete(a.pending, c)
		return
	}
	a.uncountLocked(c)
}

// uncountLocked takes an authenticated connection out of the pool.
func (a *admission) uncountLocked(c *admConn) {
	if !c.counted {
		return
	}
	c.counted = false
	a.authed--
	if c.id == nil {
		return
	}
	s := a.byID[*c.id]
	if s == nil {
		return
	}
	for i, o := range s.conns {
		if o == c {
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			break
		}
	}
	a.forgetLocked(*c.id, s)
}

// listener is lis within the admission's bounds.
func (a *admission) listener(lis net.Listener) net.Listener {
	if a.lim.oldAdmission {
		return netutil.LimitListener(lis, a.lim.MaxConns) // KNOWN-UNSAFE: the control arm
	}
	return admListener{Listener: lis, a: a}
}

// admListener hands out admConns, evicting the oldest pending one at the
// cap.
type admListener struct {
	net.Listener
	a *admission
}

func (l admListener) Accept() (net.Conn, error) {
	raw, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &admConn{Conn: raw, a: l.a, since: time.Now()}
	var oldest *admConn
	l.a.mu.Lock()
	if len(l.a.pending) >= l.a.lim.MaxConns {
		oldest = l.a.oldestPendingLocked()
	}
	l.a.pending[c] = struct{}{}
	l.a.mu.Unlock()
	if oldest != nil {
		l.a.evicted.Add(1)
		l.a.warn("control port: closed the oldest unfinished handshake for a new connection", "pending", l.a.lim.MaxConns)
		_ = oldest.Close()
	}
	return c, nil
}

// oldestPendingLocked is the connection to evict from a full pending
// pool: the oldest that has sent nothing, else the oldest. Caller holds
// a.mu.
func (a *admission) oldestPendingLocked() *admConn {
	var mute, any *admConn
	for p := range a.pending {
		if any == nil || p.since.Before(any.since) {
			any = p
		}
		if !p.spoke.Load() && (mute == nil || p.since.Before(mute.since)) {
			mute = p
		}
	}
	if mute != nil {
		return mute
	}
	return any
}

// admCreds runs the real handshake, then admits the connection under its
// certificate.
type admCreds struct {
	credentials.TransportCredentials
	a *admission
}

func (c admCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	ac, ok := raw.(*admConn)
	if !ok { // the control arm's listener
		return conn, info, nil
	}
	var id *certID
	if ti, ok := info.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		sum := certID(sha256.Sum256(ti.State.PeerCertificates[0].Raw))
		id = &sum
	}
	if err := c.a.authenticate(ac, id); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, info, nil
}

func (c admCreds) Clone() credentials.TransportCredentials {
	return admCreds{TransportCredentials: c.TransportCredentials.Clone(), a: c.a}
}

// authenticate moves c from the pending pool to the authenticated one
// under id (nil: no TLS), within the pool's and the certificate's bounds.
func (a *admission) authenticate(c *admConn, id *certID) error {
	var displaced *admConn
	a.mu.Lock()
	if _, ok := a.pending[c]; !ok {
		a.mu.Unlock()
		return errdefs.Errorf(errdefs.Unavailable, "control connection evicted during its handshake")
	}
	var s *idState
	if id != nil {
		s = a.idLocked(*id)
		if !s.connRate.Allow() {
			a.mu.Unlock()
			a.refused.Add(1)
			a.warn("control port: a certificate opens connections faster than allowed", "rate", a.lim.ConnRate)
			return errdefs.Errorf(errdefs.ResourceExhausted, "too many new connections for this certificate")
		}
		if len(s.conns) >= a.lim.MaxConnsPerIdentity {
			displaced = s.conns[0]
		}
	}
	if displaced == nil && a.authed >= a.lim.MaxConns {
		a.mu.Unlock()
		a.refused.Add(1)
		a.warn("control port: every authenticated slot is taken", "max", a.lim.MaxConns)
		return errdefs.Errorf(errdefs.ResourceExhausted, "control port full")
	}
	if displaced != nil {
		a.uncountLocked(displaced)
		s = a.idLocked(*id) // uncount may have forgotten it
	}
	delete(a.pending, c)
	a.authed++
	c.id, c.counted = id, true
	if s != nil {
		s.conns = append(s.conns, c)
		a.most = max(a.most, len(s.conns))
	}
	a.mu.Unlock()
	if displaced != nil {
		a.displace.Add(1)
		a.warn("control port: a certificate's newest connection displaced its oldest", "per_certificate", a.lim.MaxConnsPerIdentity)
		_ = displaced.Close()
	}
	return nil
}

// peerCertID is the certificate a link's connection proved; false without
// TLS.
func peerCertID(ctx context.Context) (certID, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return certID{}, false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return certID{}, false
	}
	return certID(sha256.Sum256(ti.State.PeerCertificates[0].Raw)), true
}

// joinRouter admits one more router link of the certificate that ctx's
// connection proved; it returns the command limiter the link shares with
// that certificate's other links and a release to call when it ends.
func (a *admission) joinRouter(ctx context.Context) (*rate.Limiter, func(), error) {
	id, hasID := peerCertID(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.routers >= a.lim.MaxRouters {
		return nil, nil, errdefs.Errorf(errdefs.ResourceExhausted, "already %d router links open", a.lim.MaxRouters)
	}
	var s *idState
	limiter := rate.NewLimiter(rate.Limit(a.lim.CommandRate), a.lim.CommandBurst)
	if a.lim.oldAdmission {
		limiter, hasID = nil, false // KNOWN-UNSAFE: the control arm
	}
	if hasID {
		s = a.idLocked(id)
		if s.routers >= a.lim.MaxRoutersPerIdentity {
			return nil, nil, errdefs.Errorf(errdefs.ResourceExhausted, "this certificate already has %d router links open", a.lim.MaxRoutersPerIdentity)
		}
		s.routers++
		a.mostRouters = max(a.mostRouters, s.routers)
		limiter = s.cmdRate
	}
	a.routers++
	release := sync.OnceFunc(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.routers--
		if s != nil {
			s.routers--
			a.forgetLocked(id, s)
		}
	})
	return limiter, release, nil
}

// routerKeepalive is how often dialCommands (the router link) sends an empty command, so an
// idle router's link outlives RouterIdleTimeout.
const routerKeepalive = 15 * time.Second

// dropIdle closes l once it has received no frame for idle.
func dropIdle(l *link, idle time.Duration, onDrop func()) {
	t := time.NewTicker(idle / 4)
	defer t.Stop()
	for {
		select {
		case <-l.closed():
			return
		case <-t.C:
			if time.Since(time.Unix(0, l.lastRecv.Load())) > idle {
				onDrop()
				l.close()
				return
			}
		}
	}
}

// keepAlive sends an empty command on a router's link every period until
// it closes; agents skip it (commandLink.Recv), and it keeps the link
// inside the agent's RouterIdleTimeout.
func keepAlive(l *link, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-l.closed():
			return
		case <-t.C:
			l.send(&frame{Type: frameCommand})
		}
	}
}

// checkOwnCertificate refuses to start an agent whose own TLS certificate
// is expired or not yet valid: its peers would refuse every link anyway,
// with an error that names them instead of it.
func checkOwnCertificate(c *tls.Config, now time.Time) error {
	if c == nil {
		return nil
	}
	for _, cert := range c.Certificates {
		leaf := cert.Leaf
		if leaf == nil && len(cert.Certificate) > 0 {
			var err error
			if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
				return errdefs.Errorf(errdefs.InvalidArgument, "own TLS certificate: %v", err)
			}
		}
		if leaf == nil {
			continue
		}
		switch {
		case now.After(leaf.NotAfter):
			return errdefs.Errorf(errdefs.FailedPrecondition, "own TLS certificate %q expired at %s", leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339))
		case now.Before(leaf.NotBefore):
			return errdefs.Errorf(errdefs.FailedPrecondition, "own TLS certificate %q is not valid before %s", leaf.Subject.CommonName, leaf.NotBefore.UTC().Format(time.RFC3339))
		}
	}
	return nil
}
