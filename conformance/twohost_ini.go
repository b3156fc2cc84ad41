package conformance

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// iniSide is the initiator of a two-host run: its plugin process, its
// source memory and its completions. It is its own small type, not a
// session: a session's checks of target memory assume that memory is
// local, and here it is on the other host.
type iniSide struct {
	p       *sdk.Plugin
	t       sdk.Transport
	src     *sdk.SharedMemory
	srcID   sdk.RegionID
	peer    sdk.PeerID
	timeout time.Duration

	mu      sync.Mutex
	changed *sync.Cond
	got     map[sdk.BatchID][]sdk.Completion
	nextID  sdk.BatchID
	done    chan struct{}
	ended   chan struct{}
}

func newIniSide(timeout time.Duration) *iniSide {
	in := &iniSide{timeout: timeout, got: map[sdk.BatchID][]sdk.Completion{}, done: make(chan struct{}),
		ended: make(chan struct{}), nextID: sdk.BatchID(time.Now().UnixNano() & 0xffffffff)}
	in.changed = sync.NewCond(&in.mu)
	return in
}

// collect gathers the completions; drain empties the host's event channel.
func (in *iniSide) collect() {
	defer close(in.ended)
	for c := range in.t.Completions() {
		in.mu.Lock()
		in.got[c.Batch] = append(in.got[c.Batch], c)
		in.changed.Broadcast()
		in.mu.Unlock()
	}
	in.mu.Lock()
	in.changed.Broadcast()
	in.mu.Unlock()
}

func (in *iniSide) drain() {
	for {
		select {
		case <-in.done:
			return
		case <-in.p.Events():
		}
	}
}

func (in *iniSide) id() sdk.BatchID {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.nextID++
	return in.nextID
}

func (in *iniSide) write(key sdk.Key, srcOff, dstOff, n uint64) sdk.Batch {
	return sdk.Batch{ID: in.id(), Peer: in.peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: in.srcID,
		LocalOffset: srcOff, RemoteKey: key, RemoteOffset: dstOff, Length: n}}}
}

func (in *iniSide) split(key sdk.Key, srcOff, dstOff, n, chunk uint64) sdk.Batch {
	b := sdk.Batch{ID: in.id(), Peer: in.peer}
	for o := uint64(0); o < n; o += chunk {
		b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: in.srcID, LocalOffset: srcOff + o,
			RemoteKey: key, RemoteOffset: dstOff + o, Length: min(chunk, n-o)})
	}
	return b
}

// wait returns the first completion of id, or an error after d.
func (in *iniSide) wait(id sdk.BatchID, d time.Duration) (sdk.Completion, error) {
	deadline := time.Now().Add(d)
	t := time.AfterFunc(d, func() { in.mu.Lock(); in.changed.Broadcast(); in.mu.Unlock() })
	defer t.Stop()
	in.mu.Lock()
	defer in.mu.Unlock()
	for len(in.got[id]) == 0 {
		if !time.Now().Before(deadline) {
			return sdk.Completion{}, broke(PromiseOneCompletion, fmt.Errorf("batch %d: no completion within %v (a completion is owed for every accepted batch)", id, d))
		}
		select {
		case <-in.ended:
			return sdk.Completion{}, broke(PromiseOneCompletion, fmt.Errorf("batch %d: completion stream closed without it", id))
		default:
		}
		in.changed.Wait()
	}
	return in.got[id][0], nil
}

func (in *iniSide) postWait(ctx context.Context, b sdk.Batch) (sdk.Completion, error) {
	if err := in.t.Post(ctx, b); err != nil {
		return sdk.Completion{}, fmt.Errorf("Post: %w", err)
	}
	return in.wait(b.ID, in.timeout)
}

func (in *iniSide) count(id sdk.BatchID) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.got[id])
}

func (in *iniSide) quiesce(ctx context.Context, ids ...sdk.BatchID) (sdk.QuiesceResult, error) {
	ctx, cancel := context.WithTimeout(ctx, in.timeout)
	defer cancel()
	return in.t.Quiesce(ctx, in.peer, ids)
}

func (in *iniSide) close() {
	select {
	case <-in.done:
		return
	default:
		close(in.done)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if in.t != nil && in.srcID != 0 {
		_ = in.t.DeregisterMemory(ctx, in.srcID)
	}
	if in.p != nil {
		_ = in.p.Close()
	}
	if in.src != nil {
		_ = in.src.Close()
	}
}
