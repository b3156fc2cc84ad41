package sdk

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk/internal/ring"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
)

// ringsAttacher is the plugin's side of the negotiation (served by
// grpcServer next to kvfence.transport.v1).
type ringsAttacher interface {
	attach(ctx context.Context, req *pb.Endpoint) (*pb.Endpoint, error)
}

// ringsServiceDesc is written by hand rather than generated: it has one
// unary method over an existing message, and keeping it out of the
// .proto file means older plugins simply do not have it (Unimplemented).
var ringsServiceDesc = grpc.ServiceDesc{
	ServiceName: "kvfence.transport.v1.Rings",
	HandlerType: (*ringsAttacher)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Attach",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(pb.Endpoint)
			if err := dec(in); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) {
				return srv.(ringsAttacher).attach(ctx, req.(*pb.Endpoint))
			}
			if icpt == nil {
				return call(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: ringsAttachMethod}, call)
		},
	}},
	Metadata: "sdk/ring_plugin.go",
}

// attach maps the host's rings and starts serving Posts from them. From
// then on the completion stream carries no completions: it only ends, and
// its end still tells the host that this plugin is gone.
func (s *grpcServer) attach(ctx context.Context, req *pb.Endpoint) (*pb.Endpoint, error) {
	capacity, bells, err := parseRingsOffer(req)
	if err != nil {
		return nil, fail(ctx, err)
	}
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	if s.rings != nil || s.streamOn {
		return nil, fail(ctx, errdefs.Errorf(errdefs.FailedPrecondition, "rings: already attached or stream open"))
	}
	m, err := MapMemory(MemoryDesc{Kind: MemoryHostShared, Path: req.GetAddress(), Size: ring.LayoutSize(capacity)})
	if err != nil {
		return nil, fail(ctx, err)
	}
	if err := ring.CheckLayout(m.Bytes(), capacity); err != nil {
		_ = m.Close()
		return nil, fail(ctx, err)
	}
	pr := &pluginRings{m: m, impl: s.impl, sub: ring.Submission(m.Bytes(), capacity), comp: ring.Completion(m.Bytes(), capacity),
		flags: ring.HostFlags(m.Bytes()), stop: make(chan struct{}), stopped: make(chan struct{})}
	if err := pr.usePipes(bells); err != nil {
		pr.closeBells()
		_ = m.Close()
		return nil, fail(ctx, err)
	}
	s.rings = pr
	go pr.consume()
	return &pb.Endpoint{Transport: req.GetTransport()}, nil
}

// parseRingsOffer reads the host's offer: the capacity and, with v2, the
// doorbell pipes' paths. KVFENCE_RINGS=v1 refuses v2 as a plugin that
// predates it does (InvalidArgument), so the host's fallback can be tried.
func parseRingsOffer(req *pb.Endpoint) (capacity uint64, bells []string, err error) {
	o := req.GetOpaque()
	switch {
	case req.GetTransport() == ringsDataPath && len(o) == 8:
	case req.GetTransport() == ringsDataPathV2 && len(o) > 8 && os.Getenv(envRings) != "v1":
		bells = strings.Split(string(o[8:]), "\n")
		if len(bells) != 2 {
			return 0, nil, errdefs.Errorf(errdefs.InvalidArgument, "rings: want 2 doorbell pipes, got %d", len(bells))
		}
	default:
		return 0, nil, errdefs.Errorf(errdefs.InvalidArgument, "rings: unknown data path %q", req.GetTransport())
	}
	capacity = binary.LittleEndian.Uint64(o)
	if !ring.ValidCapacity(capacity) {
		return 0, nil, errdefs.Errorf(errdefs.InvalidArgument, "rings: capacity %d", capacity)
	}
	return capacity, bells, nil
}

// usePipes opens the host's doorbell pipes (v2): the plugin sleeps on the
// submissions' and rings the completions'. None: the futex (v1).
func (p *pluginRings) usePipes(paths []string) error {
	for _, path := range paths {
		f, err := ring.OpenPipe(path)
		if err != nil {
			return errdefs.Errorf(errdefs.InvalidArgument, "rings: doorbell pipe: %v", err)
		}
		p.bells = append(p.bells, f)
	}
	if len(p.bells) == 0 {
		return nil
	}
	if err := p.sub.UsePipe(p.bells[0], p.bells[0]); err != nil {
		return errdefs.Errorf(errdefs.InvalidArgument, "rings: doorbell pipe: %v", err)
	}
	if err := p.comp.UsePipe(nil, p.bells[1]); err != nil {
		return errdefs.Errorf(errdefs.InvalidArgument, "rings: doorbell pipe: %v", err)
	}
	return nil
}

func (p *pluginRings) closeBells() {
	for _, f := range p.bells {
		_ = f.Close()
	}
}

// takeRings hands the attached rings to the completion stream, once.
func (s *grpcServer) takeRings() *pluginRings {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	r := s.rings
	s.rings = nil
	return r
}

// pluginRings is the plugin's end: it consumes submissions and produces
// verdicts and completions.
type pluginRings struct {
	m     *Mapping
	bells []*os.File // the host's doorbell pipes (v2): submissions', completions'
	impl  Transport
	sub   *ring.Ring // plugin consumes

	compMu sync.Mutex // verdicts (consumer goroutine) and completions (stream goroutine) share it
	comp   *ring.Ring
	flags  *atomic.Uint32 // the host's flags, in the shared control page

	stop     chan struct{}
	stopped  chan struct{}
	unmapped bool // under compMu
}

// consume serves Posts until stopped or the host breaks the ring format.
func (p *pluginRings) consume() {
	defer close(p.stopped)
	var buf []byte
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		p.sub.Wait(p.stop)
		for held := 0; ; held++ {
			kind, seq, payload, b, ok, err := p.sub.Next(buf)
			buf = b
			if err != nil || (ok && kind != ring.RecPost) {
				p.flush()
				return // a host that breaks the format gets no more verdicts
			}
			if !ok {
				break
			}
			// While more submissions wait, verdicts are visible at once but
			// ring the host's doorbell together (one wake-up), at most
			// ringHoldMax of them.
			hold := held < ringHoldMax && p.sub.Available()
			p.verdict(seq, p.post(payload), !hold)
			if !hold {
				held = -1
			}
		}
	}
}

// ringHoldMax bounds how many records the plugin publishes before it
// rings, so a long run of submissions or completions cannot keep a
// sleeping host from a verdict it waits for for more than a few Posts.
const ringHoldMax = 16

// flush rings for records published quietly.
func (p *pluginRings) flush() {
	p.compMu.Lock()
	defer p.compMu.Unlock()
	if !p.unmapped {
		p.comp.Doorbell()
	}
}

func (p *pluginRings) post(payload []byte) error {
	b, err := decodePostRecord(payload)
	if err != nil {
		return errdefs.Errorf(errdefs.InvalidArgument, "Post: undecodable submission: %v", err)
	}
	return p.impl.Post(context.Background(), b)
}

// verdict reports Post's outcome; errors keep their class (unclassified
// ones become Internal, as over gRPC).
func (p *pluginRings) verdict(seq uint64, err error, wake bool) {
	if err == nil {
		p.put(ring.RecPostOK, seq, nil, wake && p.flags.Load()&ring.QuietAccepts == 0)
		return
	}
	var e *errdefs.Error
	if !errors.As(err, &e) {
		e = errdefs.Errorf(errdefs.Internal, "%v", err)
	}
	b := appendCompletionRecord(nil, Completion{Class: e.Class, Detail: truncateDetail(e.Msg)})
	p.put(ring.RecPostErr, seq, b, wake)
}

// forward moves the transport's completions into the ring until the
// transport closes its channel or the host goes away; then it releases
// the rings. Its return ends the stream, after the last completion is in.
func (p *pluginRings) forward(ctx context.Context, ch <-chan Completion) error {
	defer p.close()
	var rec []byte // the record being written, reused: put copies it into the ring
	for {
		select {
		case <-ctx.Done():
			return nil
		case c, ok := <-ch:
			if !ok {
				return nil
			}
			for held := 0; ; held++ {
				c.Detail = truncateDetail(c.Detail)
				rec = appendCompletionRecord(rec[:0], c)
				// Completions already queued behind this one ring the
				// doorbell together (one wake-up), at most ringHoldMax.
				var more bool
				if held < ringHoldMax {
					select {
					case next, open := <-ch:
						if open {
							p.put(ring.RecCompletion, 0, rec, false)
							c, more = next, true
						}
					default:
					}
				}
				if !more {
					p.put(ring.RecCompletion, 0, rec, true)
					break
				}
			}
		}
	}
}

// put publishes one record, waiting for room (the host drains
// continuously) unless stopping. Unless ring, a sleeping host is woken
// only by a later put or flush that rings.
func (p *pluginRings) put(kind uint16, seq uint64, payload []byte, wake bool) {
	p.compMu.Lock()
	defer p.compMu.Unlock()
	for !p.unmapped {
		err := p.comp.Put(kind, seq, payload)
		if err == nil {
			p.comp.PublishQuiet()
			if wake {
				p.comp.Doorbell()
			}
			return
		}
		if !errors.Is(err, ring.ErrFull) || !ring.WaitRoom(p.stop) {
			return
		}
		p.comp.Publish()
	}
}

func (p *pluginRings) close() {
	close(p.stop)
	p.sub.Interrupt()
	<-p.stopped
	p.compMu.Lock()
	p.unmapped = true
	_ = p.m.Close()
	p.closeBells()
	p.compMu.Unlock()
}

// maxRingDetail bounds a completion's human detail on the ring, so a
// record always fits.
const maxRingDetail = 4096

func truncateDetail(s string) string {
	if len(s) > maxRingDetail {
		return s[:maxRingDetail]
	}
	return s
}
