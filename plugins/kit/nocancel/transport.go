package nocancel

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// Config is what a vendor plugin gives New.
type Config struct {
	Backend Backend
	// MaxTail is the honest tail of the backend's link (UnboundedTail over
	// TCP); MaxBatch and MaxOpBytes are the backend's limits.
	MaxTail    time.Duration
	MaxBatch   int
	MaxOpBytes uint64
	// DirListen is the directory listener's address (default 127.0.0.1:0).
	DirListen string
	// ReportAfter: a batch with tasks still WAITING/PENDING after this long
	// is reported InDoubt (the backend would wait forever); its job is still
	// polled, and freed only once every task is terminal. Default
	// DefaultReportAfter.
	ReportAfter time.Duration
	// PollEvery is the polling period of live jobs. Default 200µs.
	PollEvery time.Duration
	// Verdict replaces the package's Verdict (only the deliberately broken
	// variants that tests must catch use it).
	Verdict func(tasks []Task, confirms, expired bool) (sdk.Completion, bool)
	Logger  hclog.Logger
	// lieAfter selects the deliberately broken succeed-early variant
	// (kvfenceunsafe builds only; see unsafe_verdict.go).
	lieAfter int
}

// Transport implements sdk.Transport and sdk.Granter (Grant only: Revoke is
// Unimplemented and Capabilities.Revoke is false).
type Transport struct {
	cfg Config
	be  Backend
	log hclog.Logger
	dir *directory
	out chan sdk.Completion

	mu         sync.Mutex
	closed     bool
	nextRegion sdk.RegionID
	nextPeer   int
	regions    map[sdk.RegionID]*region
	grants     map[sdk.Key]grant
	peers      map[sdk.PeerID]*peer
	live       map[sdk.BatchID]*batch
	finished   map[sdk.BatchID]bool // batch -> every task confirmed (clean)
	stats      map[string]uint64

	stop chan struct{}
	done chan struct{}
}

type region struct {
	id      sdk.RegionID
	mapping *sdk.Mapping
	addr    uintptr
	size    uint64
	pins    int // live tasks reading it
	tainted int // tasks that ended without confirmation: the backend may still read it
	grants  int
}

type grant struct {
	region *region
	off, n uint64
}

type peer struct {
	id       sdk.PeerID
	name     string
	seg      Segment
	dir      *dirClient
	confirms bool
	keys     map[sdk.Key]window
}

// DefaultReportAfter is how long a batch may stay WAITING/IN_PROG before it
// is reported InDoubt. It must be well under the completion timeouts hosts
// use (the conformance suite's default is 30 s): a report due at the
// host's own deadline races it (measured against the real Mooncake, a
// write to a stopped target reported at 30 s arrived late). The verdict
// is the same either way (InDoubt); only its timing changes.
const DefaultReportAfter = 20 * time.Second

// New starts the directory and the poller.
func New(cfg Config) (*Transport, error) {
	if cfg.DirListen == "" {
		cfg.DirListen = "127.0.0.1:0"
	}
	if cfg.ReportAfter <= 0 {
		cfg.ReportAfter = DefaultReportAfter
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = 200 * time.Microsecond
	}
	if cfg.Verdict == nil {
		cfg.Verdict = Verdict
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	t := &Transport{cfg: cfg, be: cfg.Backend, log: cfg.Logger, out: make(chan sdk.Completion, 4096),
		regions: map[sdk.RegionID]*region{}, grants: map[sdk.Key]grant{}, peers: map[sdk.PeerID]*peer{},
		live: map[sdk.BatchID]*batch{}, finished: map[sdk.BatchID]bool{}, stats: map[string]uint64{},
		stop: make(chan struct{}), done: make(chan struct{})}
	d, err := listenDirectory(cfg.DirListen, t.be.Framing(), t.be.Metadata, t.lookup)
	if err != nil {
		return nil, err
	}
	t.dir = d
	go t.poll()
	return t, nil
}

// Info declares no Revoke and the configured tail.
func (t *Transport) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: "kvfence-" + t.be.Name(), Version: t.be.Version(), ProtocolVersion: sdk.ProtocolVersion,
		Capabilities: sdk.Capabilities{MaxTail: t.cfg.MaxTail, MaxBatch: t.cfg.MaxBatch, MaxOpBytes: t.cfg.MaxOpBytes,
			MemoryKinds: []sdk.MemoryKind{sdk.MemoryHostShared}}}, nil
}

// RegisterMemory maps host memory (never Go heap: the backend keeps the
// pointer) and registers it with the backend.
func (t *Transport) RegisterMemory(_ context.Context, desc sdk.MemoryDesc) (sdk.RegionID, error) {
	if desc.Kind != sdk.MemoryHostShared {
		return 0, errdefs.Errorf(errdefs.Unimplemented, "RegisterMemory: %v memory is not supported by %s", desc.Kind, t.be.Name())
	}
	m, err := sdk.MapMemory(desc)
	if err != nil {
		return 0, err
	}
	b := m.Bytes()
	addr := uintptr(unsafe.Pointer(&b[0]))
	if err := t.be.Register(addr, uint64(len(b))); err != nil {
		_ = m.Close()
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = t.be.Unregister(addr)
		_ = m.Close()
		return 0, errdefs.Errorf(errdefs.FailedPrecondition, "RegisterMemory: transport closed")
	}
	t.nextRegion++
	t.regions[t.nextRegion] = &region{id: t.nextRegion, mapping: m, addr: addr, size: uint64(len(b))}
	return t.nextRegion, nil
}

// DeregisterMemory refuses while keys exist on the region (the backend
// cannot revoke them: deregistering is checked once per request, so a write
// under way lands anyway), while live tasks read it, and after a task that
// read it ended unconfirmed (the backend may still read it).
func (t *Transport) DeregisterMemory(_ context.Context, id sdk.RegionID) error {
	t.mu.Lock()
	r := t.regions[id]
	switch {
	case r == nil:
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.NotFound, "DeregisterMemory: region %d", id)
	case r.grants > 0:
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.FailedPrecondition, "DeregisterMemory: region %d has %d keys, which %s cannot revoke; end this plugin process to stop writes into it", id, r.grants, t.be.Name())
	case r.pins > 0:
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.FailedPrecondition, "DeregisterMemory: region %d is the source of %d tasks still in flight", id, r.pins)
	case r.tainted > 0:
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.FailedPrecondition, "DeregisterMemory: region %d is the source of %d tasks that ended unconfirmed; %s may still read it", id, r.tainted, t.be.Name())
	}
	delete(t.regions, id)
	t.mu.Unlock()
	if err := t.be.Unregister(r.addr); err != nil {
		t.log.Warn("backend unregister failed; memory stays mapped", "region", id, "err", err)
		return nil
	}
	return r.mapping.Close()
}

// Grant exposes a window under a fresh key. The key is this process's
// bookkeeping: the backend enforces no keys.
func (t *Transport) Grant(_ context.Context, w sdk.Window) (sdk.Key, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.regions[w.Region]
	if r == nil {
		return 0, errdefs.Errorf(errdefs.NotFound, "Grant: region %d", w.Region)
	}
	if w.Length == 0 || !inBounds(w.Offset, w.Length, r.size) {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "Grant: window [%d,+%d) outside region %d of %d bytes", w.Offset, w.Length, w.Region, r.size)
	}
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		k := sdk.Key(binary.LittleEndian.Uint64(b[:]))
		if _, dup := t.grants[k]; k != 0 && !dup {
			t.grants[k] = grant{region: r, off: w.Offset, n: w.Length}
			r.grants++
			return k, nil
		}
	}
}

// Revoke is not offered: the backend cannot stop a peer's writes.
func (t *Transport) Revoke(context.Context, sdk.Key) (sdk.RevokeResult, error) {
	return sdk.RevokeResult{}, errdefs.Errorf(errdefs.Unimplemented, "Revoke: %s cannot revoke a peer's access", t.be.Name())
}

func (t *Transport) lookup(k sdk.Key) (window, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, ok := t.grants[k]
	if !ok {
		return window{}, false
	}
	return window{g.region.addr + uintptr(g.off), g.n}, true
}

// LocalEndpoint: Address is the backend's own name for this process;
// Opaque is the directory's address.
func (t *Transport) LocalEndpoint(context.Context) (sdk.Endpoint, error) {
	return sdk.Endpoint{Transport: t.be.Name(), Address: t.be.LocalName(), Opaque: []byte(t.dir.Addr())}, nil
}

// Connect opens the peer in the backend and asks its directory for its
// framing.
func (t *Transport) Connect(_ context.Context, ep sdk.Endpoint) (sdk.PeerID, error) {
	if ep.Transport != t.be.Name() || ep.Address == "" || len(ep.Opaque) == 0 {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "Connect: not a %s endpoint: %q %q", t.be.Name(), ep.Transport, ep.Address)
	}
	dc, h, err := dialDirectory(string(ep.Opaque))
	if err != nil {
		return "", err
	}
	framing := h.framing
	seg, err := t.be.Open(ep.Address, h.metadata)
	if err != nil {
		dc.Close()
		return "", err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextPeer++
	p := &peer{id: sdk.PeerID(fmt.Sprintf("%s-peer-%d", t.be.Name(), t.nextPeer)), name: ep.Address, seg: seg, dir: dc,
		confirms: t.be.Confirms(framing), keys: map[sdk.Key]window{}}
	t.peers[p.id] = p
	t.log.Info("connected", "peer", p.id, "address", ep.Address, "framing", framing, "completed_means_applied", p.confirms)
	return p.id, nil
}

// Disconnect forgets the peer. Its live batches keep being polled (the
// backend cannot stop them) and are reported as they end.
func (t *Transport) Disconnect(_ context.Context, id sdk.PeerID) error {
	t.mu.Lock()
	p := t.peers[id]
	delete(t.peers, id)
	t.mu.Unlock()
	if p == nil {
		return errdefs.Errorf(errdefs.NotFound, "Disconnect: peer %q", id)
	}
	p.dir.Close()
	return nil
}

func (t *Transport) Completions() <-chan sdk.Completion { return t.out }

// Stats reports the lifecycle counters.
func (t *Transport) Stats(context.Context) (map[string]uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]uint64, len(t.stats)+2)
	for k, v := range t.stats {
		out[k] = v
	}
	out["batches_live"] = uint64(len(t.live))
	var tainted uint64
	for _, r := range t.regions {
		tainted += uint64(r.tainted)
	}
	out["tasks_tainting_sources"] = tainted
	return out, nil
}

// Close reports every unreported batch InDoubt and closes the stream. Jobs
// are not freed: the backend may still run them; ending the process is what
// stops them.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	close(t.stop)
	<-t.done
	t.dir.Close()
	t.mu.Lock()
	for id, b := range t.live {
		if !b.reported {
			b.reported = true // a submit call still blocked must not answer Post with an error now
			if b.submitting {
				close(b.abandoned) // and Post returns now
			}
			t.out <- sdk.Completion{Batch: id, Status: sdk.InDoubt, Class: errdefs.Unavailable, Detail: "transport closed with the batch in flight"}
		}
	}
	t.mu.Unlock()
	close(t.out)
	return nil
}

func inBounds(off, n, size uint64) bool { return n <= size && off <= size-n }
