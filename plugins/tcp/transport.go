package tcp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// Name and Version identify the plugin in Info.
const (
	Name    = "kvfence-tcp"
	Version = "0.1.0"
)

// Transport is the TCP transport: an sdk.Transport, sdk.Granter and
// sdk.StatsReporter.
type Transport struct {
	cfg   Config
	log   hclog.Logger
	recv  *receiver
	id    *identity // this process's certificate (nil: the cleartext variant)
	stats stats

	mu         sync.Mutex
	closed     bool
	regions    map[sdk.RegionID]*region
	nextRegion sdk.RegionID
	keys       map[sdk.Key]*exposure
	revoked    []revokedExposure // revoked keys, oldest first, to be forgotten (retention.go)
	peers      map[sdk.PeerID]*peer
	nextPeer   uint64
	batchIDs   map[sdk.BatchID]struct{} // every id ever accepted (ids are unique per instance; 8 bytes each, kept for life)

	// batchMu is a leaf lock (taken under s.mu by settle): batches holds
	// accepted batches whose operations are not all resolved yet.
	batchMu sync.Mutex
	batches map[sdk.BatchID]*batchState

	compMu   sync.Mutex
	compCond *sync.Cond
	compQ    []sdk.Completion
	compSent uint64 // completions produced (the lose-completion variant counts them)
	compDone bool
	pumping  bool // the pump holds completions not yet on the channel
	out      chan sdk.Completion
	pumpEnd  chan struct{}
}

var (
	_ sdk.Transport     = (*Transport)(nil)
	_ sdk.Granter       = (*Transport)(nil)
	_ sdk.StatsReporter = (*Transport)(nil)
)

// New starts a TCP transport listening on cfg.ListenAddr.
func New(cfg Config, log hclog.Logger) (*Transport, error) {
	cfg = cfg.withDefaults()
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "listen %s: %v", cfg.ListenAddr, err)
	}
	t := &Transport{
		cfg:      cfg,
		log:      log,
		regions:  map[sdk.RegionID]*region{},
		keys:     map[sdk.Key]*exposure{},
		peers:    map[sdk.PeerID]*peer{},
		batchIDs: map[sdk.BatchID]struct{}{},
		batches:  map[sdk.BatchID]*batchState{},
		out:      make(chan sdk.Completion, 1024),
		pumpEnd:  make(chan struct{}),
	}
	t.compCond = sync.NewCond(&t.compMu)
	t.recv = &receiver{t: t, ln: ln, log: log, sessions: map[sessionToken]*recvSession{}, present: map[fingerprint]*presence{}, conns: map[net.Conn]*admitted{}, refusals: newRefusalLog(), stop: make(chan struct{})}
	if cfg.unsafe != unsafeCleartext {
		if t.id, err = newIdentity(); err != nil {
			_ = ln.Close()
			return nil, errdefs.Errorf(errdefs.Internal, "tcp: make an identity: %v", err)
		}
		t.recv.id, t.recv.tls = t.id, t.id.serverTLS()
	}
	go t.recv.serve()
	go t.pump()
	return t, nil
}

func randomNonZero() uint64 {
	var b [8]byte
	for {
		randomFill(b[:])
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// randomFill fills b from the system's CSPRNG (keys and session tokens
// must be unguessable; crypto/rand never fails on Linux ≥ 3.17).
func randomFill(b []byte) {
	if _, err := rand.Read(b); err != nil {
		panic("tcp: crypto/rand: " + err.Error())
	}
}

// complete queues a completion without blocking (callers hold locks); the
// pump hands them to the channel in order, unless the channel has room and
// nothing is ahead of it: then it goes on directly.
func (t *Transport) complete(c sdk.Completion) {
	switch c.Status {
	case sdk.Succeeded:
		t.stats.add(statBatchesOK, 1)
	case sdk.FailedDefinite:
		t.stats.add(statBatchesFailed, 1)
	default:
		t.stats.add(statBatchesDoubt, 1)
	}
	t.compMu.Lock()
	t.compSent++
	switch {
	case t.cfg.unsafe == unsafeDuplicateCompletion:
		t.compQ = append(t.compQ, c) // KNOWN-UNSAFE: a second completion
	case t.cfg.unsafe == unsafeLoseCompletion && t.compSent%5 == 0:
		t.compMu.Unlock() // KNOWN-UNSAFE: the completion is never sent
		return
	case t.cfg.unsafe == unsafeWrongRefusalClass && c.Status == sdk.FailedDefinite && c.Class != errdefs.Unavailable:
		c.Class = errdefs.Internal // KNOWN-UNSAFE: the receiver's reason is lost
	}
	if len(t.compQ) == 0 && !t.pumping && !t.compDone {
		// Nothing ahead of it: hand it over directly if the channel has
		// room (one goroutine switch less per batch), never blocking.
		select {
		case t.out <- c:
			t.compMu.Unlock()
			return
		default:
		}
	}
	t.compQ = append(t.compQ, c)
	t.compCond.Signal()
	t.compMu.Unlock()
}

func (t *Transport) pump() {
	defer close(t.pumpEnd)
	defer close(t.out)
	for {
		t.compMu.Lock()
		t.pumping = false
		for len(t.compQ) == 0 && !t.compDone {
			t.compCond.Wait()
		}
		if len(t.compQ) == 0 {
			t.compMu.Unlock()
			return
		}
		q := t.compQ
		t.compQ = nil
		t.pumping = true
		t.compMu.Unlock()
		for _, c := range q {
			t.out <- c
		}
	}
}

// Info declares the capabilities, MaxTail included (see Config.maxTail).
func (t *Transport) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{
		Name:            Name,
		Version:         Version,
		ProtocolVersion: sdk.ProtocolVersion,
		Capabilities: sdk.Capabilities{
			Revoke:      true,
			Read:        false,
			MaxTail:     t.cfg.maxTail(),
			MaxBatch:    t.cfg.MaxBatch,
			MaxOpBytes:  t.cfg.MaxOpBytes,
			MemoryKinds: []sdk.MemoryKind{sdk.MemoryHostShared, sdk.MemoryDMABuf}, // dmabuf: only CPU-mappable ones (memory.go)
			WriterBound: t.id != nil,
			Bounds:      keyBounds,
			BatchKeys:   true,
			// A refused write fails only its batch: the receiver drops it
			// and reads on (receiver.go), and a HELLO's keys are refused
			// one by one (admission.go, sender_dial.go). A write still
			// arriving RevokeGrace after a Revoke is another case: the
			// contract lets Revoke cut its connection off (exposure.go).
			RefusalsIsolated: true,
		},
	}, nil
}

func (t *Transport) RegisterMemory(_ context.Context, desc sdk.MemoryDesc) (sdk.RegionID, error) {
	m, err := mapRegion(desc)
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		_ = m.Close()
		return 0, errdefs.Errorf(errdefs.FailedPrecondition, "RegisterMemory: transport closed")
	}
	t.nextRegion++
	r := &region{id: t.nextRegion, mapping: m, mem: m.Bytes(), keys: map[sdk.Key]*exposure{}}
	t.regions[r.id] = r
	return r.id, nil
}

// DeregisterMemory revokes every key on the region (waiting for in-flight
// writes to stop) before unmapping it; it refuses while unsent operations
// still read from it.
func (t *Transport) DeregisterMemory(ctx context.Context, id sdk.RegionID) error {
	t.mu.Lock()
	r := t.regions[id]
	if r == nil {
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.NotFound, "DeregisterMemory: region %d", id)
	}
	r.mu.Lock()
	users := r.users
	keys := make([]*exposure, 0, len(r.keys))
	for _, e := range r.keys {
		keys = append(keys, e)
	}
	r.mu.Unlock()
	if users > 0 {
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.FailedPrecondition, "DeregisterMemory: region %d is the source of %d unsent operations", id, users)
	}
	delete(t.regions, id)
	for _, e := range keys {
		delete(t.keys, e.key)
	}
	t.mu.Unlock()
	for _, e := range keys {
		e.revoke(t.cfg.RevokeGrace)
	}
	return r.mapping.Close()
}

// LocalEndpoint's address carries this process's certificate fingerprint
// (identity.go): host:port#sha256=<hex>.
func (t *Transport) LocalEndpoint(context.Context) (sdk.Endpoint, error) {
	addr := t.recv.ln.Addr().String()
	if t.id != nil {
		addr = pinnedAddress(addr, t.id.fp)
	}
	return sdk.Endpoint{Transport: Name, Address: addr}, nil
}

// Connect needs the receiver's fingerprint in the address: a data
// connection goes only to the holder of that certificate's key.
func (t *Transport) Connect(_ context.Context, ep sdk.Endpoint) (sdk.PeerID, error) {
	if ep.Transport != "" && ep.Transport != Name {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "Connect: endpoint is for transport %q", ep.Transport)
	}
	hostPort, pin, pinned, err := splitPin(ep.Address)
	if err != nil {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "Connect: %v", err)
	}
	if _, _, err := net.SplitHostPort(hostPort); err != nil {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "Connect: address %q: %v", ep.Address, err)
	}
	if !pinned && t.id != nil {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "Connect: address %q names no receiver certificate (%s<hex>): the data plane talks only to a pinned receiver", ep.Address, pinPrefix)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", errdefs.Errorf(errdefs.FailedPrecondition, "Connect: transport closed")
	}
	t.nextPeer++
	id := sdk.PeerID(fmt.Sprintf("tcp-%d@%s", t.nextPeer, hostPort))
	t.peers[id] = &peer{id: id, addr: hostPort, pin: pin}
	return id, nil
}

// Disconnect forgets the peer; its unresolved batches are completed InDoubt
// (written ones) or FailedDefinite (never sent) by the session teardown.
func (t *Transport) Disconnect(_ context.Context, id sdk.PeerID) error {
	t.mu.Lock()
	p := t.peers[id]
	delete(t.peers, id)
	t.mu.Unlock()
	if p == nil {
		return errdefs.Errorf(errdefs.NotFound, "Disconnect: peer %q", id)
	}
	p.mu.Lock()
	s := p.sess
	p.sess = nil
	p.mu.Unlock()
	if s != nil {
		s.fail(fmt.Errorf("disconnected"))
	}
	return nil
}

// Post validates the whole batch before accepting any of it, then queues it
// on the peer's current session. It never blocks on the network.
func (t *Transport) Post(ctx context.Context, b sdk.Batch) error {
	err := t.post(ctx, b)
	if err != nil && t.cfg.unsafe == unsafeWrongErrorClass {
		// KNOWN-UNSAFE: an unclassified error (it crosses the wire as
		// Internal), so the caller cannot tell a bad argument from a bug.
		return errors.New(err.Error())
	}
	return err
}

func (t *Transport) post(_ context.Context, b sdk.Batch) error {
	if b.ID == 0 {
		return errdefs.Errorf(errdefs.InvalidArgument, "Post: batch id 0")
	}
	if len(b.Ops) == 0 {
		return errdefs.Errorf(errdefs.InvalidArgument, "Post: batch %d has no operations", b.ID)
	}
	if len(b.Ops) > t.cfg.MaxBatch {
		return errdefs.Errorf(errdefs.InvalidArgument, "Post: batch %d has %d operations, MaxBatch is %d", b.ID, len(b.Ops), t.cfg.MaxBatch)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errdefs.Errorf(errdefs.FailedPrecondition, "Post: transport closed")
	}
	if _, dup := t.batchIDs[b.ID]; dup {
		return errdefs.Errorf(errdefs.AlreadyExists, "Post: batch id %d was used before", b.ID)
	}
	p := t.peers[b.Peer]
	if p == nil {
		return errdefs.Errorf(errdefs.NotFound, "Post: peer %q", b.Peer)
	}
	regs := make([]*region, len(b.Ops))
	for i, op := range b.Ops {
		switch op.Kind {
		case sdk.OpWrite:
		case sdk.OpRead:
			return errdefs.Errorf(errdefs.Unimplemented, "Post: op %d: tcp does not read", i)
		default:
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: unknown kind %d", i, op.Kind)
		}
		if op.Length == 0 {
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: zero length", i)
		}
		if op.Length > t.cfg.MaxOpBytes {
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: %d bytes exceeds MaxOpBytes %d", i, op.Length, t.cfg.MaxOpBytes)
		}
		if op.RemoteKey == 0 {
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: key 0", i)
		}
		r := t.regions[op.LocalRegion]
		if r == nil {
			return errdefs.Errorf(errdefs.NotFound, "Post: op %d: local region %d is not registered", i, op.LocalRegion)
		}
		if !inBounds(op.LocalOffset, op.Length, uint64(len(r.mem))) {
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: [%d,+%d) outside local region of %d bytes", i, op.LocalOffset, op.Length, len(r.mem))
		}
		regs[i] = r
	}
	bs := &batchState{id: b.ID, ops: append([]sdk.Op(nil), b.Ops...), regs: regs, unresolved: len(b.Ops)}
	if err := t.enqueue(p, bs); err != nil {
		return err
	}
	t.batchIDs[b.ID] = struct{}{}
	return nil
}

// enqueue puts bs on p's usable session (starting one if needed). Caller
// holds t.mu.
func (t *Transport) enqueue(p *peer, bs *batchState) error {
	p.mu.Lock()
	s := p.sess
	if s != nil {
		s.mu.Lock()
		if !s.usable() {
			s.mu.Unlock()
			s = nil
		}
	}
	if s == nil {
		s = newSendSession(t, p, bs.ops[0].RemoteKey)
		p.sess = s
		s.mu.Lock()
	}
	p.mu.Unlock()
	defer s.mu.Unlock()
	select {
	case s.queue <- bs:
	default:
		return errdefs.Errorf(errdefs.ResourceExhausted, "Post: %d batches already queued for %s", cap(s.queue), p.id)
	}
	for _, r := range bs.regs {
		r.use()
	}
	bs.sess = s
	s.batches[bs.id] = bs
	t.batchMu.Lock()
	t.batches[bs.id] = bs
	t.batchMu.Unlock()
	bs.timer = time.AfterFunc(t.cfg.AckTimeout, func() { s.timeout(bs) })
	return nil
}

func (t *Transport) Completions() <-chan sdk.Completion { return t.out }

// Quiesce returns completions-harvested if every listed batch already
// resolved each of its operations; otherwise it tears down each session the
// unresolved ones were posted on and returns receiver-confirmed once every
// receiver confirmed, or receiver-closed if for some session the receiver
// could not confirm but had closed that connection first (closed.go): a
// dead receiver ends its senders' doubt. Unknown batch ids were never
// accepted, so they cannot move: they are covered vacuously.
func (t *Transport) Quiesce(ctx context.Context, peerID sdk.PeerID, ids []sdk.BatchID) (sdk.QuiesceResult, error) {
	if t.cfg.unsafe == unsafeQuiesceEarly {
		// KNOWN-UNSAFE: claims evidence it never obtained.
		return sdk.QuiesceResult{Evidence: sdk.EvidenceReceiverConfirmed, Batches: ids}, nil
	}
	t.mu.Lock()
	p := t.peers[peerID]
	t.mu.Unlock()
	var sessions []*sendSession
	seen := map[*sendSession]bool{}
	for _, id := range ids {
		t.batchMu.Lock()
		b := t.batches[id]
		t.batchMu.Unlock()
		if b == nil || b.sess == nil {
			continue
		}
		if p != nil && b.sess.peer != p {
			return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.InvalidArgument, "Quiesce: batch %d was not posted to %s", id, peerID)
		}
		b.sess.mu.Lock()
		open := b.unresolved > 0
		b.sess.mu.Unlock()
		if open && !seen[b.sess] {
			seen[b.sess] = true
			sessions = append(sessions, b.sess)
		}
	}
	if p == nil && len(sessions) > 0 {
		return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.NotFound, "Quiesce: peer %q", peerID)
	}
	if len(sessions) == 0 {
		return sdk.QuiesceResult{Evidence: sdk.EvidenceCompletionsHarvested, Batches: ids}, nil
	}
	confirmed, closed := 0, 0
	for _, s := range sessions {
		p.mu.Lock()
		if p.sess == s {
			p.sess = nil // new Posts go to a new connection
		}
		p.mu.Unlock()
		ev, err := s.quiesce(ctx)
		if err != nil {
			return sdk.QuiesceResult{}, err
		}
		if ev == sdk.EvidenceReceiverClosed {
			closed++
		} else {
			confirmed++
		}
	}
	if closed > 0 {
		// The weaker of the two names the whole result.
		return sdk.QuiesceResult{Evidence: sdk.EvidenceReceiverClosed, Batches: ids,
			Detail: fmt.Sprintf("%d connection(s) closed by the receiver first, %d torn down and confirmed by it", closed, confirmed)}, nil
	}
	return sdk.QuiesceResult{Evidence: sdk.EvidenceReceiverConfirmed, Batches: ids,
		Detail: fmt.Sprintf("%d connection(s) torn down and confirmed by the receiver", confirmed)}, nil
}

// Grant exposes a window of a registered region under a new random key.
// With w.Writer, only that writer's one data session may use the key;
// with w.Stride, only the window's pieces (pieces.go).
func (t *Transport) Grant(_ context.Context, w sdk.Window) (sdk.Key, error) {
	if w.Length == 0 {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "Grant: zero-length window")
	}
	if err := w.Check(); err != nil {
		return 0, err
	}
	var writer *presence
	if w.Writer != "" && t.id != nil {
		var err error
		if writer, err = t.writerPresence(w.Writer); err != nil {
			return 0, err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.regions[w.Region]
	if r == nil {
		return 0, errdefs.Errorf(errdefs.NotFound, "Grant: region %d is not registered", w.Region)
	}
	if !inBounds(w.Offset, w.Length, uint64(len(r.mem))) {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "Grant: [%d,+%d) outside region of %d bytes", w.Offset, w.Length, len(r.mem))
	}
	var k sdk.Key
	for k == 0 || t.keys[k] != nil {
		k = sdk.Key(randomNonZero())
	}
	e := newExposure(k, r, w.Offset, w.Length)
	e.setWindow(w)
	e.writer = writer
	t.keys[k] = e
	r.mu.Lock()
	r.keys[k] = e
	r.mu.Unlock()
	return k, nil
}

// writerPresence is the presence of the identity named in writer (an
// initiator's LocalEndpoint address, pin included): it must have a data
// session open here. Unlike verbs, whose key binds to one queue pair, a
// writer with several connections is not ambiguous: the key binds to the
// proven identity, for as long as it stays connected.
func (t *Transport) writerPresence(writer string) (*presence, error) {
	_, fp, pinned, err := splitPin(writer)
	switch {
	case err != nil:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "Grant: writer: %v", err)
	case !pinned:
		return nil, errdefs.Errorf(errdefs.FailedPrecondition, "Grant: writer %q names no certificate (%s<hex>), so no connection can be authenticated as it", writer, pinPrefix)
	}
	p := t.recv.presenceOf(fp)
	if p == nil {
		return nil, errdefs.Errorf(errdefs.FailedPrecondition, "Grant: writer %q is not connected", writer)
	}
	return p, nil
}

// Revoke returns once no byte under key can land. The key stays known (so
// later writes are counted as dropped and refused as revoked) until its
// region is deregistered or for revokedRetention (retention.go).
func (t *Transport) Revoke(_ context.Context, k sdk.Key) (sdk.RevokeResult, error) {
	t.mu.Lock()
	e := t.keys[k]
	t.mu.Unlock()
	if e == nil {
		return sdk.RevokeResult{}, errdefs.Errorf(errdefs.NotFound, "Revoke: unknown key")
	}
	if t.cfg.unsafe == unsafeApplyAfterRevoke {
		// KNOWN-UNSAFE: claims revocation without enforcing it.
		return sdk.RevokeResult{}, nil
	}
	res := e.revoke(t.cfg.RevokeGrace)
	t.mu.Lock()
	t.noteRevokedLocked(e, time.Now())
	t.mu.Unlock()
	return res, nil
}

func (t *Transport) Stats(context.Context) (map[string]uint64, error) {
	return t.stats.snapshot(), nil
}

// Close stops listening, tears down every connection (written batches
// complete InDoubt, queued ones FailedDefinite), and closes Completions.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	var sessions []*sendSession
	t.batchMu.Lock()
	for _, b := range t.batches {
		if b.sess != nil {
			sessions = append(sessions, b.sess)
		}
	}
	t.batchMu.Unlock()
	for _, p := range t.peers {
		p.mu.Lock()
		if p.sess != nil {
			sessions = append(sessions, p.sess)
		}
		p.mu.Unlock()
	}
	t.mu.Unlock()
	t.recv.close()
	for _, s := range sessions {
		s.fail(fmt.Errorf("transport closed"))
	}
	for _, s := range sessions {
		<-s.writerEnd
		<-s.readerEnd
		s.mu.Lock()
		for _, b := range s.batches {
			if b.timer != nil {
				b.timer.Stop()
			}
			if !b.completed {
				b.completed = true
				t.complete(sdk.Completion{Batch: b.id, Status: sdk.InDoubt, BytesLanded: b.landed, Class: errdefs.Unavailable, Detail: "transport closed"})
			}
		}
		s.mu.Unlock()
	}
	t.compMu.Lock()
	t.compDone = true
	t.compCond.Signal()
	t.compMu.Unlock()
	return nil
}
