package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/kvfence/kvfence/errdefs"
)

// The control plane is one bidirectional gRPC stream per pair of agents
// (and one from the router to each agent). Every link starts with Hello;
// the acceptor checks version, capabilities and — with mutual TLS — that
// the certificate names the role and rank the Hello claims.

const linkMethod = "/kvfence.agent.v1.Control/Link"

type linkService interface{ acceptLink(grpc.ServerStream) error }

var controlDesc = grpc.ServiceDesc{
	ServiceName: "kvfence.agent.v1.Control",
	HandlerType: (*linkService)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Link",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(linkService).acceptLink(stream)
		},
	}},
}

var linkStreamDesc = &controlDesc.Streams[0]

// stream is what a link needs of a gRPC stream, client or server side.
type stream interface {
	SendMsg(any) error
	RecvMsg(any) error
	Context() context.Context
}

// link is one established control-plane stream. Sends go through a queue
// and one writer goroutine, so that a slow peer never blocks an event loop:
// when the queue is full the frame is dropped and counted (the core
// retransmits what matters).
type link struct {
	s      stream
	peer   peerHello
	out    chan *frame
	done   chan struct{}
	once   sync.Once
	cancel func()

	sendMu  sync.Mutex // numbers and queues a frame as one step
	sendSeq atomic.Uint64
	recvSeq uint64 // only the reader touches it
	dropped atomic.Uint64
	replays atomic.Uint64
	// gate bounds what the reader hands the event loop (limits.go); nil
	// on links whose frames the loop never sees.
	gate *gate
	// lastRecv is when the last frame was read (unix nanos): a router
	// link silent too long is dropped (admission.go).
	lastRecv atomic.Int64
	// cmdRate bounds the commands read from a router's link, shared by
	// its certificate's links (admission.go); nil elsewhere.
	cmdRate *rate.Limiter
	// quiescing: the prefill rank at the far end asked to close this
	// link and decode agreed (link_quiesce.go); decode's loop only.
	quiescing bool
	// quiesceOKDue: decode owes this link's rank frameQuiesceOK, sent
	// once no grant in flight holds an Assign for the rank (link_quiesce.go).
	quiesceOKDue bool
}

func newLink(s stream, peer peerHello, cancel func()) *link {
	l := &link{s: s, peer: peer, out: make(chan *frame, 1<<14), done: make(chan struct{}), cancel: cancel}
	l.lastRecv.Store(time.Now().UnixNano())
	go l.writer()
	return l
}

func (l *link) writer() {
	for {
		select {
		case f := <-l.out:
			if err := l.s.SendMsg(f); err != nil {
				l.close()
				return
			}
		case <-l.done:
			return
		}
	}
}

// send queues a frame; false means it was dropped (link closed or full).
func (l *link) send(f *frame) bool {
	select {
	case <-l.done:
		l.dropped.Add(1)
		return false
	default:
	}
	// Numbering and queueing are one step: with several senders (the
	// router's workers share a link), a frame numbered earlier but queued
	// later would reach the peer out of sequence and be refused as a replay
	// (the request then waited out the router's 30 s reply timeout).
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	f.Seq = l.sendSeq.Add(1)
	select {
	case l.out <- f:
		return true
	default:
		l.sendSeq.Add(^uint64(0)) // not sent: give the number back
		l.dropped.Add(1)
		return false
	}
}

// recv returns the next frame in sequence. Frames whose sequence number does
// not advance (a replay, or a duplicate injected on the path) are refused
// and counted, never handed up.
func (l *link) recv(onReplay func()) (*frame, error) {
	for {
		f := new(frame)
		if err := l.s.RecvMsg(f); err != nil {
			l.close()
			return nil, err
		}
		l.lastRecv.Store(time.Now().UnixNano())
		if f.Seq <= l.recvSeq {
			l.replays.Add(1)
			if onReplay != nil {
				onReplay()
			}
			continue
		}
		l.recvSeq = f.Seq
		return f, nil
	}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		if l.cancel != nil {
			l.cancel()
		}
	})
}

func (l *link) closed() <-chan struct{} { return l.done }

// server accepts links. accept decides about a Hello: it returns the Welcome
// to send, or an error that is sent as Refuse.
type server struct {
	grpc   *grpc.Server
	lis    net.Listener
	tls    bool
	lim    Limits
	adm    *admission // connection pools and router links (admission.go)
	accept func(h peerHello) (peerHello, error)
	serve  func(l *link) // runs the accepted link until it ends
}

func newServer(addr string, tlsCfg *tls.Config, lim Limits, accept func(peerHello) (peerHello, error), serve func(*link)) (*server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	adm := newAdmission(lim, nil)
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	opts := append(lim.serverOptions(), grpc.ForceServerCodec(frameCodec{}), grpc.Creds(admCreds{TransportCredentials: creds, a: adm}))
	lis = adm.listener(lis)
	s := &server{lis: lis, tls: tlsCfg != nil, lim: lim, adm: adm, accept: accept, serve: serve}
	s.grpc = grpc.NewServer(opts...)
	s.grpc.RegisterService(&controlDesc, s)
	go func() { _ = s.grpc.Serve(lis) }()
	return s, nil
}

func (s *server) Addr() string { return s.lis.Addr().String() }

func (s *server) Stop() { s.grpc.Stop() }

func (s *server) acceptLink(st grpc.ServerStream) error {
	first, err := s.hello(st)
	if err != nil {
		return err
	}
	refuse := func(err error) error {
		c := errdefs.ClassOf(err)
		if c == errdefs.Unknown {
			c = errdefs.FailedPrecondition
		}
		msg := err.Error()
		var e *errdefs.Error
		if errors.As(err, &e) {
			msg = e.Msg
		}
		_ = st.SendMsg(&frame{Type: frameRefuse, Seq: 1, Refusal: msg, Class: c})
		return nil
	}
	if first.Type != frameHello || first.Hello == nil {
		return refuse(errdefs.Errorf(errdefs.InvalidArgument, "the first frame of a link must be Hello"))
	}
	h := *first.Hello
	if err := s.checkIdentity(st.Context(), h); err != nil {
		return refuse(err)
	}
	var cmdRate *rate.Limiter
	if h.Role == RoleRouter {
		lim, release, err := s.adm.joinRouter(st.Context())
		if err != nil {
			return refuse(err)
		}
		defer release()
		cmdRate = lim
	}
	welcome, err := s.accept(h)
	if err != nil {
		return refuse(err)
	}
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	l := newLink(st, h, cancel)
	l.gate = s.lim.gate()
	l.recvSeq = first.Seq
	if cmdRate != nil { // nil: not a router, or the control arm (admission.go)
		l.cmdRate = cmdRate
		go dropIdle(l, s.lim.RouterIdleTimeout, func() {
			s.adm.warn("control port: dropped a router link silent too long", "idle", s.lim.RouterIdleTimeout)
		})
	}
	l.send(&frame{Type: frameWelcome, Hello: &welcome})
	if cmdRate != nil {
		// A router's link ends when the agent drops it (admission.go),
		// even while its router-link handler waits in Recv: returning ends
		// the stream, and that wait with it.
		served := make(chan struct{})
		go func() { s.serve(l); close(served) }()
		select {
		case <-served:
		case <-l.closed():
		}
		l.close()
		return nil
	}
	s.serve(l)
	l.close()
	<-ctx.Done()
	return nil
}

// hello reads a link's first frame, which must come within the handshake
// timeout: a connection that opens a stream and stays silent is dropped.
func (s *server) hello(st grpc.ServerStream) (*frame, error) {
	got := make(chan error, 1)
	first := new(frame)
	go func() { got <- st.RecvMsg(first) }()
	t := time.NewTimer(s.lim.HandshakeTimeout)
	defer t.Stop()
	select {
	case err := <-got:
		return first, err
	case <-t.C:
		return nil, errdefs.Errorf(errdefs.Unavailable, "no Hello within %v", s.lim.HandshakeTimeout)
	}
}

// checkIdentity: with mutual TLS, the client certificate's common name must
// be "<role>-<rank>" (or "router") and match the Hello.
func (s *server) checkIdentity(ctx context.Context, h peerHello) error {
	if !s.tls {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return errdefs.Errorf(errdefs.FailedPrecondition, "no peer information")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return errdefs.Errorf(errdefs.FailedPrecondition, "mutual TLS required: no client certificate")
	}
	cn := ti.State.PeerCertificates[0].Subject.CommonName
	if want := IdentityName(h.Role, h.Rank); cn != want {
		return errdefs.Errorf(errdefs.FailedPrecondition, "certificate names %q but Hello claims %q", cn, want)
	}
	return nil
}

// dial opens a link to addr, meaning to reach the peer want, and exchanges
// Hello/Welcome. With TLS the server's certificate must name want (checked
// in the handshake, before anything is sent); the Welcome must claim it
// too. A Refuse comes back as an error carrying the acceptor's words.
func dial(ctx context.Context, addr string, tlsCfg *tls.Config, want identity, hello peerHello) (*link, *grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	var wrongPeer atomic.Pointer[errdefs.Error]
	if tlsCfg != nil {
		creds = credentials.NewTLS(clientTLS(tlsCfg, want, addr, &wrongPeer))
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(frameCodec{})))
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	fail := func(err error) (*link, *grpc.ClientConn, error) {
		cancel()
		cc.Close()
		if e := wrongPeer.Load(); e != nil {
			return nil, nil, e
		}
		return nil, nil, err
	}
	st, err := cc.NewStream(sctx, linkStreamDesc, linkMethod)
	if err != nil {
		return fail(err)
	}
	if err := st.SendMsg(&frame{Type: frameHello, Seq: 1, Hello: &hello}); err != nil {
		return fail(err)
	}
	type res struct {
		f   *frame
		err error
	}
	ch := make(chan res, 1)
	go func() {
		f := new(frame)
		err := st.RecvMsg(f)
		ch <- res{f, err}
	}()
	var r res
	select {
	case r = <-ch:
	case <-ctx.Done():
		r.err = ctx.Err()
	}
	if e := wrongPeer.Load(); e != nil {
		r.err = e // whatever else failed, the handshake refused the peer first
	} else if r.err == nil && r.f.Type == frameRefuse {
		c := r.f.Class
		if c == errdefs.Unknown {
			c = errdefs.FailedPrecondition
		}
		r.err = errdefs.Errorf(c, "refused by peer: %s", r.f.Refusal)
	} else if r.err == nil && (r.f.Type != frameWelcome || r.f.Hello == nil) {
		r.err = errdefs.Errorf(errdefs.Internal, "link to %s: expected Welcome, got frame type %d", addr, r.f.Type)
	} else if r.err == nil && (identity{r.f.Hello.Role, r.f.Hello.Rank}) != want {
		r.err = errdefs.Errorf(errdefs.FailedPrecondition, "link to %s: meant %s, but the peer welcomed as %s",
			addr, want, identity{r.f.Hello.Role, r.f.Hello.Rank})
	}
	if r.err != nil {
		cancel()
		cc.Close()
		return nil, nil, r.err
	}
	l := newLink(st, *r.f.Hello, cancel)
	l.sendSeq.Store(1)
	l.recvSeq = r.f.Seq
	go func() { <-l.closed(); cc.Close() }()
	return l, cc, nil
}
