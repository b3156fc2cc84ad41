package verbs

// This file: the sending side. Peers, their queue pairs, and Post: one
// ibv_post_send chain per batch, only its last request signalled.

import (
	"context"
	"net"

	"github.com/kvfence/kvfence/sdk"
)

type peer struct {
	id   sdk.PeerID
	addr string
	cur  *conn   // the QP new batches go to (nil: reconnect on next Post)
	old  []*conn // QPs retired but not yet flushed and destroyed
}

type conn struct {
	qp   *qp
	ctrl net.Conn
	ep   *epoch
	// broken: the QP is in ERROR (by the device or by us); no more posts.
	broken    bool
	destroyed bool
}

func (t *Transport) Connect(ctx context.Context, ep sdk.Endpoint) (sdk.PeerID, error) {
	if ep.Transport != "verbs" || ep.Address == "" {
		return "", sdk.Errorf(sdk.ClassInvalidArgument, "verbs: endpoint %q/%q is not a verbs endpoint", ep.Transport, ep.Address)
	}
	if _, port, err := net.SplitHostPort(ep.Address); err != nil || port == "" {
		return "", sdk.Errorf(sdk.ClassInvalidArgument, "verbs: endpoint address %q is not host:port", ep.Address)
	}
	id := sdk.PeerID("verbs://" + ep.Address)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", sdk.Errorf(sdk.ClassUnavailable, "verbs: closed")
	}
	if _, ok := t.peers[id]; ok {
		return id, nil
	}
	p := &peer{id: id, addr: ep.Address}
	c, err := t.dialLocked(p)
	if err != nil {
		return "", err
	}
	p.cur = c
	t.peers[id] = p
	return id, nil
}

func (t *Transport) Disconnect(ctx context.Context, id sdk.PeerID) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.peers[id]
	if !ok {
		return sdk.Errorf(sdk.ClassNotFound, "verbs: peer %s", id)
	}
	for _, c := range p.conns() {
		t.emitLocked(c.ep.abandon("peer disconnected before its batches were quiesced")...)
		t.destroyLocked(c)
	}
	delete(t.peers, id)
	return nil
}

func (p *peer) conns() []*conn {
	out := append([]*conn(nil), p.old...)
	if p.cur != nil {
		out = append(out, p.cur)
	}
	return out
}

func (t *Transport) Post(ctx context.Context, b sdk.Batch) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return sdk.Errorf(sdk.ClassUnavailable, "verbs: closed")
	}
	if len(b.Ops) == 0 {
		return sdk.Errorf(sdk.ClassInvalidArgument, "verbs: empty batch")
	}
	if len(b.Ops) > t.cfg.MaxBatch {
		return sdk.Errorf(sdk.ClassInvalidArgument, "verbs: %d operations, max %d", len(b.Ops), t.cfg.MaxBatch)
	}
	if t.used[b.ID] {
		return sdk.Errorf(sdk.ClassAlreadyExists, "verbs: batch id %d reused", b.ID)
	}
	p, ok := t.peers[b.Peer]
	if !ok {
		return sdk.Errorf(sdk.ClassNotFound, "verbs: peer %s", b.Peer)
	}
	wrs := make([]wr, len(b.Ops))
	regs := make([]sdk.RegionID, len(b.Ops))
	for i, op := range b.Ops {
		if op.Kind != sdk.OpWrite && op.Kind != sdk.OpRead {
			return sdk.Errorf(sdk.ClassInvalidArgument, "verbs: op %d: kind %d", i, op.Kind)
		}
		if op.Length == 0 || op.Length > maxOpBytes {
			return sdk.Errorf(sdk.ClassInvalidArgument, "verbs: op %d: length %d", i, op.Length)
		}
		r, ok := t.regions[op.LocalRegion]
		if !ok {
			return sdk.Errorf(sdk.ClassNotFound, "verbs: op %d: region %d", i, op.LocalRegion)
		}
		if op.LocalOffset+op.Length < op.LocalOffset || op.LocalOffset+op.Length > r.desc.Size {
			return sdk.Errorf(sdk.ClassInvalidArgument, "verbs: op %d: local [%d,+%d) outside region of %d", i, op.LocalOffset, op.Length, r.desc.Size)
		}
		raddr, ok := remoteAddr(op.RemoteKey, op.RemoteOffset, op.Length)
		if !ok || op.RemoteKey == 0 {
			return sdk.Errorf(sdk.ClassInvalidArgument, "verbs: op %d: remote offset %d", i, op.RemoteOffset)
		}
		wrs[i] = wr{LAddr: r.localAddr(op.LocalOffset), Len: uint32(op.Length), LKey: r.mr.lkey(),
			RAddr: raddr, RKey: keyRKey(op.RemoteKey), Read: op.Kind == sdk.OpRead}
		regs[i] = op.LocalRegion
	}
	c := p.cur
	if c == nil || c.broken {
		if c != nil {
			p.old = append(p.old, c)
			p.cur = nil
		}
		var err error
		if c, err = t.dialLocked(p); err != nil {
			return err
		}
		p.cur = c
		t.stats["reconnects"]++
	}
	// One chain per batch, only its last request signalled: the send queue
	// completes in order, so that one completion settles the batch (see
	// epoch); the others cost no completion-queue entry. (The QP holds one
	// request more than QueueDepth: room for the closing request of a cut
	// chain.)
	if c.ep.outstanding+len(wrs) > t.cfg.QueueDepth {
		return sdk.Errorf(sdk.ClassResourceExhausted, "verbs: send queue to %s full (%d in flight)", p.id, c.ep.outstanding)
	}
	ids := make([]uint64, len(wrs), len(wrs)+1)
	sizes := make([]uint64, len(wrs), len(wrs)+1)
	var total uint64
	for i := range wrs {
		t.nextWR++
		wrs[i].ID = t.nextWR
		ids[i] = t.nextWR
		sizes[i] = uint64(wrs[i].Len)
		total += sizes[i]
	}
	wrs[len(wrs)-1].Signal = true
	t.nextWR++
	closeID := t.nextWR
	n, closed, err := c.qp.post(wrs, closeID)
	if n == 0 {
		if err == nil {
			err = sdk.Errorf(sdk.ClassInternal, "verbs: nothing posted")
		}
		return err // nothing of the batch was posted: nothing moves
	}
	ids, sizes = ids[:n], sizes[:n]
	if n < len(wrs) {
		t.log.Warn("ibv_post_send cut a batch's chain", "batch", b.ID, "posted", n, "of", len(wrs), "err", err, "closed", closed)
		if closed {
			// The posted part ends with a signalled copy of its last request.
			ids, sizes = append(ids, closeID), append(sizes, 0)
		} else if !wrs[n-1].Signal {
			// Nothing signalled ends the posted part: no completion is due
			// for it. Post nothing more on this QP; a Quiesce (QP to ERROR,
			// flush) settles the batch, or leaves it in doubt.
			c.broken = true
		}
	}
	t.used[b.ID] = true
	t.owner[b.ID] = c
	t.regUse[b.ID] = regs
	for _, id := range regs {
		t.regions[id].inUse++
	}
	c.ep.add(b.ID, ids, sizes, total, n < len(wrs))
	t.stats["batches_posted"]++
	t.stats["wrs_posted"] += uint64(len(ids))
	select {
	case t.wake <- struct{}{}:
	default:
	}
	return nil
}
