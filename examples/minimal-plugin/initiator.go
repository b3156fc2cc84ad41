package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// peer is one target; its sender goroutine sends queued batches over one
// connection (dialled again after a failure).
type peer struct {
	id    sdk.PeerID
	addr  string
	queue chan *batch
	quit  chan struct{}
	conn  net.Conn // sender goroutine only
}

// batch is a posted batch; done is closed once its completion was sent.
type batch struct {
	b      sdk.Batch
	srcs   []*region
	status sdk.Status
	done   chan struct{}
}

func (t *transport) Connect(_ context.Context, ep sdk.Endpoint) (sdk.PeerID, error) {
	if ep.Transport != "example" {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "Connect: not an example endpoint (%q)", ep.Transport)
	}
	if _, _, err := net.SplitHostPort(ep.Address); err != nil {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "Connect: address %q: %v", ep.Address, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", errdefs.Errorf(errdefs.FailedPrecondition, "Connect: transport closed")
	}
	t.nextPeer++
	p := &peer{id: sdk.PeerID(fmt.Sprintf("peer-%d", t.nextPeer)), addr: ep.Address, queue: make(chan *batch, 4096), quit: make(chan struct{})}
	t.peers[p.id] = p
	t.wg.Add(1)
	go t.send(p)
	return p.id, nil
}

func (t *transport) Disconnect(_ context.Context, id sdk.PeerID) error {
	t.mu.Lock()
	p := t.peers[id]
	delete(t.peers, id)
	t.mu.Unlock()
	if p == nil {
		return errdefs.Errorf(errdefs.NotFound, "Disconnect: peer %q", id)
	}
	p.stop()
	return nil
}

func (p *peer) stop() { close(p.quit) }

// Post checks everything it can locally, pins the sources and queues the
// batch; the target checks keys and windows.
func (t *transport) Post(_ context.Context, b sdk.Batch) error {
	if len(b.Ops) == 0 || len(b.Ops) > maxBatch {
		return errdefs.Errorf(errdefs.InvalidArgument, "Post: %d ops (1 to %d)", len(b.Ops), maxBatch)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errdefs.Errorf(errdefs.FailedPrecondition, "Post: transport closed")
	}
	if t.posted[b.ID] != nil {
		return errdefs.Errorf(errdefs.AlreadyExists, "Post: batch %d", b.ID)
	}
	p := t.peers[b.Peer]
	if p == nil {
		return errdefs.Errorf(errdefs.NotFound, "Post: peer %q", b.Peer)
	}
	bt := &batch{b: b, done: make(chan struct{})}
	for i, op := range b.Ops {
		switch {
		case op.Kind == sdk.OpRead:
			return errdefs.Errorf(errdefs.Unimplemented, "Post: op %d: reads are not supported", i)
		case op.Kind != sdk.OpWrite:
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: unknown kind %d", i, op.Kind)
		case op.Length == 0 || op.Length > maxOpBytes:
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: length %d (1 to %d)", i, op.Length, maxOpBytes)
		}
		r := t.regions[op.LocalRegion]
		if r == nil {
			return errdefs.Errorf(errdefs.NotFound, "Post: op %d: region %d", i, op.LocalRegion)
		}
		if op.Length > uint64(len(r.mem)) || op.LocalOffset > uint64(len(r.mem))-op.Length {
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: outside region %d", i, op.LocalRegion)
		}
		bt.srcs = append(bt.srcs, r)
	}
	for _, r := range bt.srcs {
		r.users++
	}
	t.posted[b.ID] = bt
	select {
	case p.queue <- bt:
		return nil
	default:
		for _, r := range bt.srcs {
			r.users--
		}
		delete(t.posted, b.ID)
		return errdefs.Errorf(errdefs.ResourceExhausted, "Post: peer %q has 4096 batches queued", b.Peer)
	}
}

// send runs a peer's batches in order until the peer is stopped; batches
// left then complete InDoubt (they may be in the socket).
func (t *transport) send(p *peer) {
	defer t.wg.Done()
	for {
		select {
		case <-p.quit:
			if p.conn != nil {
				p.conn.Close()
			}
			for {
				select {
				case bt := <-p.queue:
					t.finish(bt, sdk.Completion{Status: sdk.InDoubt, Class: errdefs.Unavailable, Detail: "peer disconnected"})
				default:
					return
				}
			}
		case bt := <-p.queue:
			t.finish(bt, t.run(p, bt))
		}
	}
}

// run sends one batch's writes one at a time, each acknowledged before the
// next is sent.
func (t *transport) run(p *peer, bt *batch) sdk.Completion {
	if p.conn == nil {
		c, err := net.DialTimeout("tcp", p.addr, t.ttl)
		if err != nil {
			// Nothing of the batch was sent: it can never land.
			return sdk.Completion{Status: sdk.FailedDefinite, Class: errdefs.Unavailable, Detail: "dial: " + err.Error()}
		}
		p.conn = c
	}
	var landed uint64
	hdr := make([]byte, headerBytes)
	for i, op := range bt.b.Ops {
		deadline := time.Now().Add(t.ttl)
		header{key: uint64(op.RemoteKey), off: op.RemoteOffset, n: op.Length, deadline: deadline.UnixNano()}.put(hdr)
		_ = p.conn.SetDeadline(deadline)
		reply := []byte{0xff}
		_, err := p.conn.Write(hdr)
		if err == nil {
			_, err = p.conn.Write(bt.srcs[i].mem[op.LocalOffset : op.LocalOffset+op.Length])
		}
		if err == nil {
			_, err = p.conn.Read(reply)
		}
		if err != nil {
			// The frame may be in the target's socket buffer: it can land
			// until its deadline (MaxTail covers that).
			p.conn.Close()
			p.conn = nil
			return sdk.Completion{Status: sdk.InDoubt, BytesLanded: landed, Class: errdefs.Unavailable, Detail: fmt.Sprintf("op %d: %v", i, err)}
		}
		switch reply[0] {
		case replyApplied:
			landed += op.Length
		case replyRevoked, replyExpired, replyUnknown, replyOutWindow:
			// The target applied nothing of this op and nothing later of
			// the batch is sent.
			return sdk.Completion{Status: sdk.FailedDefinite, BytesLanded: landed, Class: refusalClass[reply[0]], Detail: fmt.Sprintf("op %d refused by the target (reply %d)", i, reply[0])}
		default:
			p.conn.Close()
			p.conn = nil
			return sdk.Completion{Status: sdk.InDoubt, BytesLanded: landed, Class: errdefs.Internal, Detail: "bad reply"}
		}
	}
	return sdk.Completion{Status: sdk.Succeeded, BytesLanded: landed}
}

// finish unpins the sources, then reports: nothing reads them any more.
func (t *transport) finish(bt *batch, c sdk.Completion) {
	c.Batch = bt.b.ID
	t.mu.Lock()
	for _, r := range bt.srcs {
		r.users--
	}
	bt.status = c.Status
	t.mu.Unlock()
	t.out <- c
	close(bt.done)
}

// Quiesce waits (up to 10 s) for the batches to complete. Succeeded and
// FailedDefinite batches are evidence in themselves; an InDoubt one has
// none here: its frame may still sit in the target's socket until its
// deadline.
func (t *transport) Quiesce(ctx context.Context, id sdk.PeerID, ids []sdk.BatchID) (sdk.QuiesceResult, error) {
	wait := time.NewTimer(10 * time.Second)
	defer wait.Stop()
	for _, bid := range ids {
		t.mu.Lock()
		bt := t.posted[bid]
		t.mu.Unlock()
		if bt == nil {
			return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.NotFound, "Quiesce: batch %d", bid)
		}
		if bt.b.Peer != id {
			return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.InvalidArgument, "Quiesce: batch %d was not posted to %q", bid, id)
		}
		select {
		case <-bt.done:
		case <-wait.C:
			return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.Unavailable, "Quiesce: batch %d still in flight", bid)
		case <-ctx.Done():
			return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.Unavailable, "Quiesce: %v", ctx.Err())
		}
		t.mu.Lock()
		st := bt.status
		t.mu.Unlock()
		if st == sdk.InDoubt {
			return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.Unavailable, "Quiesce: batch %d is in doubt and this plugin has no evidence (its bytes may land until their deadline)", bid)
		}
	}
	return sdk.QuiesceResult{Evidence: sdk.EvidenceCompletionsHarvested, Batches: ids}, nil
}
