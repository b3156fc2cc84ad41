package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

const (
	maxBatch   = 256
	maxOpBytes = 16 << 20
)

// transport is both sides: an initiator (peers, batches) and a target
// (listener, keys). Memory comes from the host as shared memory.
type transport struct {
	log hclog.Logger
	ln  net.Listener
	ttl time.Duration
	out chan sdk.Completion
	wg  sync.WaitGroup // peer senders

	mu         sync.Mutex
	closed     bool
	regions    map[sdk.RegionID]*region
	nextRegion sdk.RegionID
	keys       map[sdk.Key]*exposure
	peers      map[sdk.PeerID]*peer
	nextPeer   int
	posted     map[sdk.BatchID]*batch
	conns      map[net.Conn]bool
}

// region is registered memory; users counts queued writes that read it.
type region struct {
	id      sdk.RegionID
	mapping *sdk.Mapping
	mem     []byte
	users   int
	keys    map[sdk.Key]*exposure
}

func newTransport(listen string, ttl time.Duration, log hclog.Logger) (*transport, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "listen %s: %v", listen, err)
	}
	t := &transport{log: log, ln: ln, ttl: ttl, out: make(chan sdk.Completion, 4096),
		regions: map[sdk.RegionID]*region{}, keys: map[sdk.Key]*exposure{}, peers: map[sdk.PeerID]*peer{},
		posted: map[sdk.BatchID]*batch{}, conns: map[net.Conn]bool{}}
	go t.accept()
	return t, nil
}

// Info: MaxTail is the frame TTL (the target refuses expired frames) plus
// a second for the copy that follows the deadline check.
func (t *transport) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: "kvfence-example", Version: "0.1.0", ProtocolVersion: sdk.ProtocolVersion,
		Capabilities: sdk.Capabilities{Revoke: true, MaxTail: t.ttl + time.Second, MaxBatch: maxBatch,
			MaxOpBytes: maxOpBytes, MemoryKinds: []sdk.MemoryKind{sdk.MemoryHostShared}}}, nil
}

func (t *transport) RegisterMemory(_ context.Context, d sdk.MemoryDesc) (sdk.RegionID, error) {
	if d.Kind != sdk.MemoryHostShared {
		return 0, errdefs.Errorf(errdefs.Unimplemented, "RegisterMemory: %v memory is not supported", d.Kind)
	}
	m, err := sdk.MapMemory(d)
	if err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextRegion++
	t.regions[t.nextRegion] = &region{id: t.nextRegion, mapping: m, mem: m.Bytes(), keys: map[sdk.Key]*exposure{}}
	return t.nextRegion, nil
}

// DeregisterMemory revokes every key on the region before unmapping it,
// and refuses while queued writes still read it.
func (t *transport) DeregisterMemory(_ context.Context, id sdk.RegionID) error {
	t.mu.Lock()
	r := t.regions[id]
	switch {
	case r == nil:
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.NotFound, "DeregisterMemory: region %d", id)
	case r.users > 0:
		t.mu.Unlock()
		return errdefs.Errorf(errdefs.FailedPrecondition, "DeregisterMemory: region %d is read by %d queued writes", id, r.users)
	}
	delete(t.regions, id)
	keys := r.keys
	t.mu.Unlock()
	for _, e := range keys {
		e.revoke()
	}
	return r.mapping.Close()
}

func (t *transport) Grant(_ context.Context, w sdk.Window) (sdk.Key, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.regions[w.Region]
	if r == nil {
		return 0, errdefs.Errorf(errdefs.NotFound, "Grant: region %d", w.Region)
	}
	if w.Length == 0 || w.Length > uint64(len(r.mem)) || w.Offset > uint64(len(r.mem))-w.Length {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "Grant: window [%d,+%d) outside region %d", w.Offset, w.Length, w.Region)
	}
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		k := sdk.Key(binary.LittleEndian.Uint64(b[:]))
		if _, dup := t.keys[k]; k != 0 && !dup {
			e := &exposure{r: r, off: w.Offset, n: w.Length}
			t.keys[k], r.keys[k] = e, e
			return k, nil
		}
	}
}

// Revoke: once it returns, no byte lands under the key. The exposure stays
// known (revoked), so a second Revoke is a no-op.
func (t *transport) Revoke(_ context.Context, k sdk.Key) (sdk.RevokeResult, error) {
	t.mu.Lock()
	e := t.keys[k]
	if e != nil {
		delete(e.r.keys, k)
	}
	t.mu.Unlock()
	if e == nil {
		return sdk.RevokeResult{}, errdefs.Errorf(errdefs.NotFound, "Revoke: key %#x", uint64(k))
	}
	e.revoke()
	return sdk.RevokeResult{WritesApplied: e.applied.Load(), WritesDropped: e.refused.Load()}, nil
}

func (e *exposure) revoke() {
	e.mu.Lock() // waits for an apply under way
	e.revoked = true
	e.mu.Unlock()
}

func (t *transport) LocalEndpoint(context.Context) (sdk.Endpoint, error) {
	return sdk.Endpoint{Transport: "example", Address: t.ln.Addr().String()}, nil
}

func (t *transport) Completions() <-chan sdk.Completion { return t.out }

// Close ends every peer (their batches complete InDoubt unless already
// done), the listener and the connections, then the completion stream.
func (t *transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	peers := t.peers
	t.peers = map[sdk.PeerID]*peer{}
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	_ = t.ln.Close()
	for _, p := range peers {
		p.stop()
	}
	t.wg.Wait()
	close(t.out)
	return nil
}
