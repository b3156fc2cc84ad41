package conformance

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// session is one initiator/target pair with source memory registered at the
// initiator, destination memory at the target, the initiator connected to
// the target (through the fault proxy when there is one), and collectors of
// the initiator's completions and host events. Checks of one session run one
// at a time, so the watcher may treat any change of dst as theirs.
type session struct {
	s        *suite
	ini, tgt *proc
	src      *sdk.SharedMemory
	dst      targetMem
	srcID    sdk.RegionID
	dstID    sdk.RegionID
	peer     sdk.PeerID
	proxy    *Proxy
	size     uint64
	ledger   *ledger
	// unsettled: a Quiesce here gave no evidence, so by the plugin's own
	// account a batch may still move bytes into dst, for as long as its
	// tail (unbounded for Mooncake and NIXL). The next check must not
	// share this memory with it (suite.renewMain).
	unsettled bool

	mu      sync.Mutex
	changed *sync.Cond
	got     map[sdk.BatchID][]sdk.Completion
	events  []sdk.Event
	nextID  sdk.BatchID
	done    chan struct{} // collectors stop
	ended   chan struct{} // completion stream closed
	// collecting: collect runs (and closes ended when the stream ends).
	collecting bool
}

// newSession starts a fresh pair. useProxy puts the fault proxy in the path
// when the link allows it.
func (s *suite) newSession(ctx context.Context, useProxy bool) (se *session, err error) {
	return s.newSessionSized(ctx, useProxy, max(s.cfg.MaxWriteSize, 4<<20)+1<<20)
}

// newSessionSized is newSession with size bytes of memory on each side.
func (s *suite) newSessionSized(ctx context.Context, useProxy bool, size uint64) (se *session, err error) {
	se = &session{s: s, size: size, ledger: newLedger(), got: map[sdk.BatchID][]sdk.Completion{},
		done: make(chan struct{}), ended: make(chan struct{}), nextID: sdk.BatchID(time.Now().UnixNano() & 0xffffffff)}
	se.changed = sync.NewCond(&se.mu)
	defer func() {
		if err != nil {
			se.close()
			se = nil
		}
	}()
	if se.tgt, err = s.open(ctx, "target", s.cfg.TargetEnv); err != nil {
		return se, err
	}
	if se.ini, err = s.open(ctx, "initiator", s.cfg.InitiatorEnv); err != nil {
		return se, err
	}
	// Record what is posted and granted, so that every Succeeded can be
	// checked against target memory (verify.go).
	se.ini.t = recordingTransport{Transport: se.ini.t, l: se.ledger}
	if se.tgt.g != nil {
		se.tgt.g = recordingGranter{Granter: se.tgt.g, l: se.ledger}
	}
	if se.src, err = sdk.NewSharedMemory("conformance-src", se.size); err != nil {
		return se, err
	}
	if se.dst, err = s.targetMemory(se.tgt, se.size); err != nil {
		return se, err
	}
	pattern(se.src.Bytes(), 1)
	if se.srcID, err = se.ini.t.RegisterMemory(ctx, se.src.Desc()); err != nil {
		return se, fmt.Errorf("initiator RegisterMemory: %w", err)
	}
	if se.dstID, err = se.tgt.t.RegisterMemory(ctx, se.dst.Desc()); err != nil {
		return se, fmt.Errorf("target RegisterMemory: %w", err)
	}
	ep, err := se.tgt.t.LocalEndpoint(ctx)
	if err != nil {
		return se, fmt.Errorf("target LocalEndpoint: %w", err)
	}
	if s.cfg.TargetAddr != "" {
		if _, port, perr := net.SplitHostPort(ep.Address); perr == nil {
			ep.Address = net.JoinHostPort(s.cfg.TargetAddr, port)
		}
	}
	if useProxy && s.proxyOK {
		// The proxy forwards bytes to host:port; an identity the address
		// pins after '#' (tcp: the target's certificate fingerprint) still
		// names the target behind it.
		target, pin, pinned := strings.Cut(ep.Address, "#")
		if se.proxy, err = NewProxy(target); err != nil {
			return se, err
		}
		ep.Address = se.proxy.Addr()
		if pinned {
			ep.Address += "#" + pin
		}
	}
	if se.peer, err = se.ini.t.Connect(ctx, ep); err != nil {
		return se, fmt.Errorf("initiator Connect: %w", err)
	}
	se.collecting = true
	go se.collect()
	go se.collectEvents()
	return se, nil
}

// pattern fills b with a position-dependent pattern (seed varies it), so a
// byte from the wrong offset or an old write shows.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*131+i>>9) ^ seed
	}
}

func (se *session) collect() {
	defer close(se.ended)
	for c := range se.ini.t.Completions() {
		if c.Status == sdk.Succeeded {
			se.verify(c) // before any check can see it
		}
		se.mu.Lock()
		se.got[c.Batch] = append(se.got[c.Batch], c)
		se.changed.Broadcast()
		se.mu.Unlock()
	}
	se.mu.Lock()
	se.changed.Broadcast()
	se.mu.Unlock()
}

func (se *session) collectEvents() {
	for {
		select {
		case <-se.done:
			return
		case e := <-se.ini.p.Events():
			se.mu.Lock()
			se.events = append(se.events, e)
			se.changed.Broadcast()
			se.mu.Unlock()
		}
	}
}

func (se *session) close() {
	if se == nil {
		return
	}
	select {
	case <-se.done:
		return
	default:
		close(se.done)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if se.ini != nil && se.srcID != 0 {
		_ = se.ini.t.DeregisterMemory(ctx, se.srcID)
	}
	if se.tgt != nil && se.dstID != 0 {
		_ = se.tgt.t.DeregisterMemory(ctx, se.dstID)
	}
	se.ini.close()
	se.tgt.close()
	// collect verifies Succeeded completions against src and dst until the
	// initiator's completion stream ends (its Close ends it): unmap them
	// only after (a race the detector caught when a soak check ended early
	// on a lying plugin). Bounded, for a plugin that never ends it.
	if se.collecting {
		select {
		case <-se.ended:
		case <-time.After(10 * time.Second):
		}
	}
	if se.proxy != nil {
		se.proxy.Close()
	}
	if se.src != nil {
		_ = se.src.Close()
	}
	if se.dst != nil {
		_ = se.dst.Close()
	}
}

func (se *session) id() sdk.BatchID {
	se.mu.Lock()
	defer se.mu.Unlock()
	se.nextID++
	return se.nextID
}

// write is a one-op write batch.
func (se *session) write(key sdk.Key, srcOff, dstOff, n uint64) sdk.Batch {
	return sdk.Batch{ID: se.id(), Peer: se.peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: se.srcID,
		LocalOffset: srcOff, RemoteKey: key, RemoteOffset: dstOff, Length: n}}}
}

// split is a batch writing [srcOff,+n) to [dstOff,+n) as ops of at most chunk bytes.
func (se *session) split(key sdk.Key, srcOff, dstOff, n, chunk uint64) sdk.Batch {
	b := sdk.Batch{ID: se.id(), Peer: se.peer}
	for o := uint64(0); o < n; o += chunk {
		l := min(chunk, n-o)
		b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: se.srcID, LocalOffset: srcOff + o,
			RemoteKey: key, RemoteOffset: dstOff + o, Length: l})
	}
	return b
}

// wait returns the first completion of id, or an error after d.
func (se *session) wait(id sdk.BatchID, d time.Duration) (sdk.Completion, error) {
	deadline := time.Now().Add(d)
	t := time.AfterFunc(d, func() { se.mu.Lock(); se.changed.Broadcast(); se.mu.Unlock() })
	defer t.Stop()
	se.mu.Lock()
	defer se.mu.Unlock()
	for len(se.got[id]) == 0 {
		if !time.Now().Before(deadline) {
			return sdk.Completion{}, broke(PromiseOneCompletion, fmt.Errorf("batch %d: no completion within %v (a completion is owed for every accepted batch)", id, d))
		}
		select {
		case <-se.ended:
			return sdk.Completion{}, broke(PromiseOneCompletion, fmt.Errorf("batch %d: completion stream closed without it", id))
		default:
		}
		se.changed.Wait()
	}
	if err := se.lie(id); err != nil {
		return se.got[id][0], err
	}
	return se.got[id][0], nil
}

// postWait posts b and waits for its completion.
func (se *session) postWait(ctx context.Context, b sdk.Batch) (sdk.Completion, error) {
	if err := se.ini.t.Post(ctx, b); err != nil {
		return sdk.Completion{}, fmt.Errorf("Post: %w", err)
	}
	return se.wait(b.ID, se.s.cfg.CompletionTimeout)
}

func (se *session) count(id sdk.BatchID) int {
	se.mu.Lock()
	defer se.mu.Unlock()
	return len(se.got[id])
}

// violations are the protocol violations the host saw (duplicate or
// unknown completions, which the host drops before they reach us).
func (se *session) violations() []sdk.Event {
	se.mu.Lock()
	defer se.mu.Unlock()
	var out []sdk.Event
	for _, e := range se.events {
		if e.Kind == sdk.EventProtocolViolation {
			out = append(out, e)
		}
	}
	return out
}

// eventOf waits up to d for an event of kind k.
func (se *session) eventOf(k sdk.EventKind, d time.Duration) (sdk.Event, bool) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		se.mu.Lock()
		for _, e := range se.events {
			if e.Kind == k {
				se.mu.Unlock()
				return e, true
			}
		}
		se.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	return sdk.Event{}, false
}

// grant fills [off-guard, off+n+guard) of dst with sentinel and exposes [off,+n).
func (se *session) grant(ctx context.Context, off, n uint64, sentinel byte) (sdk.Key, error) {
	lo, hi := off, off+n
	if lo >= 4096 {
		lo -= 4096
	} else {
		lo = 0
	}
	hi = min(hi+4096, se.size)
	se.dst.fill(lo, hi-lo, sentinel)
	k, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Offset: off, Length: n})
	if err != nil {
		return 0, fmt.Errorf("Grant([%d,+%d)): %w", off, n, err)
	}
	return k, nil
}

// warm makes sure the initiator has a live connection to the target (so a
// fault applied next hits a connection carrying the next batch).
func (se *session) warm(ctx context.Context, key sdk.Key) error {
	c, err := se.postWait(ctx, se.write(key, 0, 0, 1))
	if err != nil {
		return fmt.Errorf("warm-up write: %w", err)
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("warm-up write on a healthy link: %v (%s)", c.Status, c.Detail)
	}
	return nil
}

// quiesce calls Quiesce with a bound.
func (se *session) quiesce(ctx context.Context, ids ...sdk.BatchID) (sdk.QuiesceResult, error) {
	ctx, cancel := context.WithTimeout(ctx, se.s.cfg.CompletionTimeout)
	defer cancel()
	q, err := se.ini.t.Quiesce(ctx, se.peer, ids)
	if err != nil {
		se.unsettled = true
	}
	return q, err
}

// healthy explains why a write on a healthy link did not simply succeed,
// keeping the error chain (a lost completion stays attributed to its promise).
func healthy(what string, c sdk.Completion, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s on a healthy link: %v (%s)", what, c.Status, c.Detail)
}
