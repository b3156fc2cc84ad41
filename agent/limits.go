package agent

import (
	"context"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits bound what any one peer can make a rank spend, so that a flooding
// or buggy peer — even one with a valid certificate — costs bounded memory
// and leaves honest peers served. Zero fields take the defaults below.
type Limits struct {
	// MaxConns caps control-port connections in each of two pools
	// (admission.go): those still handshaking — at the cap the oldest is
	// closed for a new one — and those authenticated — at the cap a new
	// one is refused (default 256).
	MaxConns int
	// MaxConnsPerIdentity caps one certificate's authenticated
	// connections; a newer one displaces and closes its oldest (default 8).
	MaxConnsPerIdentity int
	// ConnRate and ConnBurst bound one certificate's new connections a
	// second; a handshake over them fails (default 1/s after a burst of 16).
	ConnRate  float64
	ConnBurst int
	// HandshakeTimeout bounds how long a connection may take to finish TLS
	// and send its Hello (default 5s): a silent connection is dropped.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection that carries no link for this long
	// (default 30s).
	IdleTimeout time.Duration
	// MaxMessageBytes caps one received frame (default: enough for a
	// heartbeat naming twice the pool's slots, and at least 64 KiB).
	MaxMessageBytes int
	// Rate and Burst bound the frames per second one link may have read;
	// beyond them the link's reader waits, so flow control pushes back on
	// the peer instead of memory growing (default 20000/s, burst 2000).
	Rate  float64
	Burst int
	// Inflight caps the frames one link may have queued for the event
	// loop at once (default 64): the reader waits for the loop.
	Inflight int
	// MaxRouters caps concurrent router links (default 16), and
	// MaxRoutersPerIdentity those of one certificate (default 4).
	MaxRouters            int
	MaxRoutersPerIdentity int
	// RouterIdleTimeout drops a router link that received no frame this
	// long (default 60s; dialCommands (the router link) sends a keepalive every 15s).
	RouterIdleTimeout time.Duration
	// CommandRate and CommandBurst bound the commands a second read from
	// one certificate's router links together; beyond them the reader
	// waits (default 5000/s, burst 500).
	CommandRate  float64
	CommandBurst int

	// oldAdmission is the test-only control arm (admission.go): a
	// control port without per-certificate shares.
	oldAdmission bool
}

func (l Limits) withDefaults(slots int) Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = 256
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = 5 * time.Second
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 30 * time.Second
	}
	if l.MaxMessageBytes <= 0 {
		// A tag is at most 30 bytes encoded, 40 as JSON base64.
		l.MaxMessageBytes = max(64<<10, 4096+maxHeartbeatTags(slots)*40)
	}
	if l.Rate <= 0 {
		l.Rate = 20000
	}
	if l.Burst <= 0 {
		l.Burst = 2000
	}
	if l.Inflight <= 0 {
		l.Inflight = 64
	}
	if l.MaxRouters <= 0 {
		l.MaxRouters = 16
	}
	return l.admissionDefaults()
}

// admissionDefaults fills the per-certificate bounds (admission.go).
func (l Limits) admissionDefaults() Limits {
	if l.MaxConnsPerIdentity <= 0 {
		l.MaxConnsPerIdentity = 8
	}
	if l.ConnRate <= 0 {
		l.ConnRate = 1
	}
	if l.ConnBurst <= 0 {
		l.ConnBurst = 16
	}
	if l.MaxRoutersPerIdentity <= 0 {
		l.MaxRoutersPerIdentity = 4
	}
	if l.RouterIdleTimeout <= 0 {
		l.RouterIdleTimeout = time.Minute
	}
	if l.CommandRate <= 0 {
		l.CommandRate = 5000
	}
	if l.CommandBurst <= 0 {
		l.CommandBurst = 500
	}
	return l
}

// maxHeartbeatTags is the most tags an honest prefill rank names in one
// heartbeat to a decode rank of slots slots: each live exposure holds at
// least one slot, and after a restart the rank may still name the previous
// instance's exposures until they are aborted. A heartbeat names its
// whole list or, far more often, what changed since decode last answered;
// a rank sends its whole list instead once the changes outgrow it.
func maxHeartbeatTags(slots int) int { return 2*slots + 64 }

// serverOptions are the gRPC server's bounds.
func (l Limits) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.MaxRecvMsgSize(l.MaxMessageBytes),
		grpc.MaxConcurrentStreams(4), // a connection carries one link; a few for overlap
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.IdleTimeout,
			Time: l.IdleTimeout, Timeout: l.HandshakeTimeout}),
	}
}

// gate is one link's reader-side bounds: its rate and what it has queued
// on the event loop.
type gate struct {
	rate     *rate.Limiter
	inflight chan struct{}
}

func (l Limits) gate() *gate {
	return &gate{rate: rate.NewLimiter(rate.Limit(l.Rate), l.Burst), inflight: make(chan struct{}, l.Inflight)}
}

// admit waits until the link may hand one more frame to the loop; false
// when ctx ended first. The caller calls done once the loop ran it.
func (g *gate) admit(ctx context.Context) bool {
	if g.rate.Wait(ctx) != nil {
		return false
	}
	select {
	case g.inflight <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (g *gate) done() { <-g.inflight }

// toLoop hands one received input to the event loop within the link's
// bounds: it waits for the link's rate and for room among its inputs
// queued; false when the link ended first.
func (l *link) toLoop(lp *loop, input func()) bool {
	if !l.gate.admit(l.s.Context()) {
		return false
	}
	lp.post(func() {
		defer l.gate.done()
		input()
	})
	return true
}
