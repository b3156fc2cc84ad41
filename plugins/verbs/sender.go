package verbs

// This file: the sending side. Peers, their queue pairs, and Post: one
// ibv_post_send chain per batch, only its last request signalled.

import (
	"context"
	"net"

	"github.com/kvfence/kvfence/errdefs"
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
		return "", errdefs.Errorf(errdefs.InvalidArgument, "verbs: endpoint %q/%q is not a verbs endpoint", ep.Transport, ep.Address)
	}
	if _, port, err := net.SplitHostPort(ep.Address); err != nil || port == "" {
		return "", errdefs.Errorf(errdefs.InvalidArgument, "verbs: endpoint address %q is not host:port", ep.Address)
	}
	id := sdk.PeerID("verbs://" + ep.Address)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", errdefs.Errorf(errdefs.Unavailable, "verbs: closed")
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
		return errdefs.Errorf(errdefs.NotFound, "verbs: peer %s", id)
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

// Post validates the batch, chains its work requests on the peer's current
// QP (reconnecting a broken one first) and posts them with one
// ibv_post_send; it never waits for the device.
func (t *Transport) Post(ctx context.Context, b sdk.Batch) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, err := t.checkBatchLocked(b)
	if err != nil {
		return err
	}
	wrs, regs, err := t.workRequestsLocked(b.Ops)
	if err != nil {
		return err
	}
	c, err := t.sendConnLocked(p)
	if err != nil {
		return err
	}
	// One chain per batch, only its last request signalled: the send queue
	// completes in order, so that one completion settles the batch (see
	// epoch); the others cost no completion-queue entry. (The QP holds one
	// request more than QueueDepth: room for the closing request of a cut
	// chain.)
	if c.ep.outstanding+len(wrs) > t.cfg.QueueDepth {
		return errdefs.Errorf(errdefs.ResourceExhausted, "verbs: send queue to %s full (%d in flight)", p.id, c.ep.outstanding)
	}
	ids, sizes, total, closeID := t.numberLocked(wrs)
	n, closed, err := c.qp.post(wrs, closeID)
	if n == 0 {
		if err == nil {
			err = errdefs.Errorf(errdefs.Internal, "verbs: nothing posted")
		}
		return err // nothing of the batch was posted: nothing moves
	}
	ids, sizes = ids[:n], sizes[:n]
	cut := n < len(wrs)
	if cut {
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
	t.recordPostedLocked(b.ID, c, regs, ids, sizes, total, cut)
	return nil
}

// checkBatchLocked refuses a batch the transport cannot take as a whole and
// returns its peer.
func (t *Transport) checkBatchLocked(b sdk.Batch) (*peer, error) {
	switch {
	case t.closed:
		return nil, errdefs.Errorf(errdefs.Unavailable, "verbs: closed")
	case len(b.Ops) == 0:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "verbs: empty batch")
	case len(b.Ops) > t.cfg.MaxBatch:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "verbs: %d operations, max %d", len(b.Ops), t.cfg.MaxBatch)
	case t.used[b.ID]:
		return nil, errdefs.Errorf(errdefs.AlreadyExists, "verbs: batch id %d reused", b.ID)
	}
	p, ok := t.peers[b.Peer]
	if !ok {
		return nil, errdefs.Errorf(errdefs.NotFound, "verbs: peer %s", b.Peer)
	}
	return p, nil
}

// workRequestsLocked turns the operations into work requests (unnumbered,
// unsignalled) and lists the local region each one uses.
func (t *Transport) workRequestsLocked(ops []sdk.Op) ([]wr, []sdk.RegionID, error) {
	wrs := make([]wr, len(ops))
	regs := make([]sdk.RegionID, len(ops))
	for i, op := range ops {
		w, err := t.workRequestLocked(i, op)
		if err != nil {
			return nil, nil, err
		}
		wrs[i], regs[i] = w, op.LocalRegion
	}
	return wrs, regs, nil
}

// workRequestLocked validates operation i and builds its work request.
func (t *Transport) workRequestLocked(i int, op sdk.Op) (wr, error) {
	if op.Kind != sdk.OpWrite && op.Kind != sdk.OpRead {
		return wr{}, errdefs.Errorf(errdefs.InvalidArgument, "verbs: op %d: kind %d", i, op.Kind)
	}
	if op.Length == 0 || op.Length > maxOpBytes {
		return wr{}, errdefs.Errorf(errdefs.InvalidArgument, "verbs: op %d: length %d", i, op.Length)
	}
	r, ok := t.regions[op.LocalRegion]
	if !ok {
		return wr{}, errdefs.Errorf(errdefs.NotFound, "verbs: op %d: region %d", i, op.LocalRegion)
	}
	if op.LocalOffset+op.Length < op.LocalOffset || op.LocalOffset+op.Length > r.desc.Size {
		return wr{}, errdefs.Errorf(errdefs.InvalidArgument, "verbs: op %d: local [%d,+%d) outside region of %d", i, op.LocalOffset, op.Length, r.desc.Size)
	}
	raddr, ok := remoteAddr(op.RemoteKey, op.RemoteOffset, op.Length)
	if !ok || op.RemoteKey == 0 {
		return wr{}, errdefs.Errorf(errdefs.InvalidArgument, "verbs: op %d: remote offset %d", i, op.RemoteOffset)
	}
	return wr{LAddr: r.localAddr(op.LocalOffset), Len: uint32(op.Length), LKey: r.mr.lkey(),
		RAddr: raddr, RKey: keyRKey(op.RemoteKey), Read: op.Kind == sdk.OpRead}, nil
}

// sendConnLocked returns the QP new batches to p go to, replacing a broken
// one (or none) by a fresh connection; the old one waits for its flush.
func (t *Transport) sendConnLocked(p *peer) (*conn, error) {
	c := p.cur
	if c != nil && !c.broken {
		return c, nil
	}
	if c != nil {
		p.old = append(p.old, c)
		p.cur = nil
	}
	c, err := t.dialLocked(p)
	if err != nil {
		return nil, err
	}
	p.cur = c
	t.stats["reconnects"]++
	return c, nil
}

// numberLocked gives each work request its id and signals the last one; it
// returns the ids and sizes the epoch tracks (room left for the closing
// request of a cut chain), the batch's bytes and the closing request's id.
func (t *Transport) numberLocked(wrs []wr) (ids, sizes []uint64, total, closeID uint64) {
	ids = make([]uint64, len(wrs), len(wrs)+1)
	sizes = make([]uint64, len(wrs), len(wrs)+1)
	for i := range wrs {
		t.nextWR++
		wrs[i].ID = t.nextWR
		ids[i] = t.nextWR
		sizes[i] = uint64(wrs[i].Len)
		total += sizes[i]
	}
	wrs[len(wrs)-1].Signal = true
	t.nextWR++
	return ids, sizes, total, t.nextWR
}

// recordPostedLocked books a posted batch: its id is used, its QP owns it,
// its local regions are pinned, its epoch tracks it, and the polling loop
// is woken.
func (t *Transport) recordPostedLocked(id sdk.BatchID, c *conn, regs []sdk.RegionID, ids, sizes []uint64, total uint64, cut bool) {
	t.used[id] = true
	t.owner[id] = c
	t.regUse[id] = regs
	for _, r := range regs {
		t.regions[r].inUse++
	}
	c.ep.add(id, ids, sizes, total, cut)
	t.stats["batches_posted"]++
	t.stats["wrs_posted"] += uint64(len(ids))
	select {
	case t.wake <- struct{}{}:
	default:
	}
}
