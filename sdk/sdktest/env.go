package sdktest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// Pair is what the contract checks run against: a sending and a receiving
// transport (they may be the same instance), the receiver able to Grant.
type Pair struct {
	Sender   sdk.Transport
	Receiver sdk.Transport
}

// Env is one prepared pair: source memory registered at the sender,
// destination memory at the receiver, the sender connected to the receiver,
// and a collector of the sender's completions.
type Env struct {
	Pair
	Granter  sdk.Granter
	Info     sdk.Info
	Peer     sdk.PeerID
	Src, Dst *sdk.SharedMemory
	SrcID    sdk.RegionID
	DstID    sdk.RegionID

	mu      sync.Mutex
	changed *sync.Cond
	got     map[sdk.BatchID][]sdk.Completion
	nextID  sdk.BatchID
	done    chan struct{}
}

// EnvSize is the size of each of the source and destination memories.
const EnvSize = 1 << 20

// Timeout bounds every wait of a check. Generous: CI machines are slow and
// checks never assert on speed.
const Timeout = 30 * time.Second

// NewEnv prepares p. Close it when done.
func NewEnv(ctx context.Context, p Pair) (*Env, error) {
	g, ok := p.Receiver.(sdk.Granter)
	if !ok {
		return nil, fmt.Errorf("receiver does not implement sdk.Granter")
	}
	info, err := p.Sender.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("Info: %w", err)
	}
	e := &Env{Pair: p, Granter: g, Info: info, got: map[sdk.BatchID][]sdk.Completion{}, done: make(chan struct{}), nextID: sdk.BatchID(time.Now().UnixNano() & 0xffffffff)}
	e.changed = sync.NewCond(&e.mu)
	if e.Src, err = sdk.NewSharedMemory("src", EnvSize); err != nil {
		return nil, err
	}
	if e.Dst, err = sdk.NewSharedMemory("dst", EnvSize); err != nil {
		return nil, err
	}
	for i := range e.Src.Bytes() {
		e.Src.Bytes()[i] = byte(i*7 + 1)
	}
	if e.SrcID, err = p.Sender.RegisterMemory(ctx, e.Src.Desc()); err != nil {
		return nil, fmt.Errorf("RegisterMemory(src): %w", err)
	}
	if e.DstID, err = p.Receiver.RegisterMemory(ctx, e.Dst.Desc()); err != nil {
		return nil, fmt.Errorf("RegisterMemory(dst): %w", err)
	}
	ep, err := p.Receiver.LocalEndpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("LocalEndpoint: %w", err)
	}
	if e.Peer, err = p.Sender.Connect(ctx, ep); err != nil {
		return nil, fmt.Errorf("Connect: %w", err)
	}
	go e.collect()
	return e, nil
}

func (e *Env) collect() {
	defer close(e.done)
	for c := range e.Sender.Completions() {
		e.mu.Lock()
		e.got[c.Batch] = append(e.got[c.Batch], c)
		e.changed.Broadcast()
		e.mu.Unlock()
	}
	e.mu.Lock()
	e.changed.Broadcast()
	e.mu.Unlock()
}

// NewBatchID returns an id not used before in this Env.
func (e *Env) NewBatchID() sdk.BatchID {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nextID++
	return e.nextID
}

// Wait returns the first completion of id, or an error after Timeout.
func (e *Env) Wait(id sdk.BatchID) (sdk.Completion, error) { return e.waitNth(id, 0) }

// waitNth returns completion number n (from 0) of id: a check that reuses
// an id on purpose waits for the completion its own Post gets.
func (e *Env) waitNth(id sdk.BatchID, n int) (sdk.Completion, error) {
	deadline := time.Now().Add(Timeout)
	stop := time.AfterFunc(Timeout, func() { e.mu.Lock(); e.changed.Broadcast(); e.mu.Unlock() })
	defer stop.Stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(e.got[id]) <= n {
		if time.Now().After(deadline) {
			return sdk.Completion{}, fmt.Errorf("batch %d: no completion within %v", id, Timeout)
		}
		select {
		case <-e.done:
			return sdk.Completion{}, fmt.Errorf("batch %d: completion stream closed without it", id)
		default:
		}
		e.changed.Wait()
	}
	return e.got[id][n], nil
}

// StreamEnded waits until the Completions channel was closed and every
// completion on it collected (Close closes it; collection runs on its own
// goroutine, so a count read just after Close may still be short). It
// reports false if that did not happen within Timeout.
func (e *Env) StreamEnded() bool {
	select {
	case <-e.done:
		return true
	case <-time.After(Timeout):
		return false
	}
}

// Count is how many completions id received so far.
func (e *Env) Count(id sdk.BatchID) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.got[id])
}

// Write is a one-op write batch of n bytes from src offset to the key's
// window offset.
func (e *Env) Write(id sdk.BatchID, key sdk.Key, srcOff, dstOff, n uint64) sdk.Batch {
	return sdk.Batch{ID: id, Peer: e.Peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: e.SrcID, LocalOffset: srcOff,
		RemoteKey: key, RemoteOffset: dstOff, Length: n}}}
}

// Close deregisters and frees the memory (the transports are the caller's).
func (e *Env) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	_ = e.Sender.DeregisterMemory(ctx, e.SrcID)
	_ = e.Receiver.DeregisterMemory(ctx, e.DstID)
	_ = e.Src.Close()
	_ = e.Dst.Close()
}
