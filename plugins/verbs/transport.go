package verbs

import (
	"context"
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// Version of the plugin.
const Version = "0.1.0"

// Transport is the verbs transport: both the sending side (RC QPs per peer,
// Post, the polling loop, Quiesce) and the receiving side (handshake
// listener, Grant/Revoke).
type Transport struct {
	cfg  Config
	log  hclog.Logger
	d    *dev
	inf  devInfo
	mode RevokeMode
	ln   net.Listener

	mu      sync.Mutex
	changed *sync.Cond // a QP drained, or the transport closed
	closed  bool
	regions map[sdk.RegionID]*region
	nextReg sdk.RegionID
	grants  map[sdk.Key]*grant
	peers   map[sdk.PeerID]*peer
	byQPN   map[uint32]*conn      // sender QPs, for the polling loop
	owner   map[sdk.BatchID]*conn // batches whose QP may still matter
	regUse  map[sdk.BatchID][]sdk.RegionID
	used    map[sdk.BatchID]bool
	nextWR  uint64
	stats   map[string]uint64

	// amu guards the receiving side's responder QPs apart from mu, so a
	// handshake never waits for a sender holding mu (a transport may even
	// connect to itself).
	amu     sync.Mutex
	aclosed bool
	accepts map[net.Conn]*responder // one responder QP per connected sender

	comps    chan sdk.Completion
	wake     chan struct{} // a Post: the idle loop starts polling
	stop     chan struct{}
	pollDone chan struct{}
}

// New opens the device and starts the handshake listener and the polling
// loop.
func New(cfg Config, log hclog.Logger) (*Transport, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err // classified: invalid-argument
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	var gid *[16]byte
	if cfg.GID != "" {
		g, _ := parseGID(cfg.GID)
		gid = &g
	}
	d, err := openDevice(cfg.Device, gid)
	if err != nil {
		return nil, err
	}
	inf := d.info()
	mode := cfg.Revoke
	if mode == RevokeAuto {
		mode = RevokeMR
		if inf.MW1 {
			mode = RevokeMW1
		}
	}
	if mode == RevokeMW1 && !inf.MW1 {
		d.close()
		return nil, errdefs.Errorf(errdefs.Unimplemented, "verbs: device %s has no memory windows; use revoke mode mr", inf.Name)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		d.close()
		return nil, errdefs.Errorf(errdefs.Unavailable, "verbs: listen %s: %v", cfg.Listen, err)
	}
	t := newTransport(cfg, log, d, inf, mode, ln)
	go t.acceptLoop()
	go t.pollLoop()
	log.Info("verbs transport up", "device", inf.Name, "gid_index", inf.GIDIndex, "revoke", mode,
		"max_tail", cfg.MaxTail(), "listen", ln.Addr().String())
	return t, nil
}

// newTransport assembles a Transport over an opened device and listener,
// with no goroutine started yet (New starts them).
func newTransport(cfg Config, log hclog.Logger, d *dev, inf devInfo, mode RevokeMode, ln net.Listener) *Transport {
	t := &Transport{cfg: cfg, log: log, d: d, inf: inf, mode: mode, ln: ln,
		regions: map[sdk.RegionID]*region{}, grants: map[sdk.Key]*grant{}, peers: map[sdk.PeerID]*peer{},
		byQPN: map[uint32]*conn{}, owner: map[sdk.BatchID]*conn{}, regUse: map[sdk.BatchID][]sdk.RegionID{},
		used: map[sdk.BatchID]bool{}, accepts: map[net.Conn]*responder{}, stats: map[string]uint64{},
		comps: make(chan sdk.Completion, 1<<16), wake: make(chan struct{}, 1), stop: make(chan struct{}), pollDone: make(chan struct{})}
	t.changed = sync.NewCond(&t.mu)
	return t
}

// RevokeMode reports the fencing mechanism in use (mw1 or mr).
func (t *Transport) RevokeMode() RevokeMode { return t.mode }

// Device reports the opened device.
func (t *Transport) Device() string { return t.inf.Name }

func (t *Transport) Info(ctx context.Context) (sdk.Info, error) {
	return sdk.Info{
		Name:            "verbs",
		Version:         fmt.Sprintf("%s device=%s revoke=%s timeout=%d retry_cnt=%d poll=%s signal=last-of-batch", Version, t.inf.Name, t.mode, t.cfg.Timeout, t.cfg.RetryCnt, t.cfg.Poll),
		ProtocolVersion: sdk.ProtocolVersion,
		Capabilities: sdk.Capabilities{
			Revoke:      true,
			Read:        true,
			MaxTail:     t.cfg.MaxTail(),
			MaxBatch:    t.cfg.MaxBatch,
			MaxOpBytes:  maxOpBytes,
			MemoryKinds: []sdk.MemoryKind{sdk.MemoryHostShared, sdk.MemoryDMABuf},
			WriterBound: t.writerBound(),
			// Each key is its own MR or memory window over exactly its
			// range: the device refuses a write past it. Pieced windows
			// would need one window per piece: refused at Grant.
			Bounds: sdk.BoundsWindow,
		},
	}, nil
}

// Stats: counters for tests and metrics.
func (t *Transport) Stats(ctx context.Context) (map[string]uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]uint64, len(t.stats))
	for k, v := range t.stats {
		out["verbs."+k] = v
	}
	return out, nil
}

func (t *Transport) Completions() <-chan sdk.Completion { return t.comps }

// emitLocked delivers terminal completions (t.mu held).
func (t *Transport) emitLocked(cs ...sdk.Completion) {
	for _, c := range cs {
		for _, id := range t.regUse[c.Batch] {
			if r, ok := t.regions[id]; ok {
				r.inUse--
			}
		}
		delete(t.regUse, c.Batch)
		if c.Status == sdk.Succeeded {
			delete(t.owner, c.Batch)
		}
		t.stats["completions_"+c.Status.String()]++
		if !t.closed || len(t.comps) < cap(t.comps) {
			t.comps <- c
		}
	}
}

func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	ids := make([]sdk.PeerID, 0, len(t.peers))
	for id := range t.peers {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		for _, c := range t.peers[id].conns() {
			_ = c.qp.toError()
			t.emitLocked(c.ep.abandon("transport closed before the batch completed")...)
		}
	}
	t.closed = true
	t.changed.Broadcast()
	t.mu.Unlock()
	close(t.stop)
	<-t.pollDone
	_ = t.ln.Close()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		for _, c := range t.peers[id].conns() {
			t.destroyLocked(c)
		}
	}
	t.amu.Lock()
	t.aclosed = true
	for c, r := range t.accepts {
		t.retireResponderLocked(r)
		_ = c.Close()
		delete(t.accepts, c)
	}
	t.amu.Unlock()
	for k := range t.grants {
		_ = t.revokeLocked(k)
	}
	for _, r := range t.regions {
		r.release()
	}
	t.d.close()
	close(t.comps)
	return nil
}
