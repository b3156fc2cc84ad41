package nocancel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// batch is a posted batch: its backend job, its tasks as last polled, and
// the source region of each task (pinned until the task ends clean).
type batch struct {
	id       sdk.BatchID
	peer     *peer
	job      Job
	tasks    []Task
	srcs     []*region
	confirms bool
	posted   time.Time
	reported bool
	// pending: not yet handed to the backend (its submit call has not
	// returned, or the succeed-early variant of kvfenceunsafe builds); the
	// poller does not poll it. submitting: the submit call has not
	// returned (the poller still reports it at the report deadline).
	pending, submitting bool
	// abandoned is closed when the batch is reported InDoubt while its
	// submit call still blocks: Post then returns, the batch accepted.
	abandoned chan struct{}
	// refused: the library's submit was called and refused (part of the
	// job may have left); the batch cannot be Succeeded, and its sources
	// stay tainted whatever the tasks read.
	refused error
}

// Post validates the batch, resolves its keys, pins its sources and
// submits it. An error means the backend refused before anything left.
func (t *Transport) Post(_ context.Context, b sdk.Batch) error {
	if len(b.Ops) == 0 {
		return errdefs.Errorf(errdefs.InvalidArgument, "Post: empty batch")
	}
	if len(b.Ops) > t.cfg.MaxBatch {
		return errdefs.Errorf(errdefs.InvalidArgument, "Post: %d ops, at most %d", len(b.Ops), t.cfg.MaxBatch)
	}
	p, ws, srcs, err := t.admit(b)
	if err != nil {
		return err
	}
	// Keys are resolved outside the lock (one directory round trip the first
	// time a key is used; keys cannot be revoked, so the answer stays true).
	if err := t.resolveDsts(p, b, ws); err != nil {
		return err
	}
	t.mu.Lock()
	bt, err := t.enter(b.ID, p, ws, srcs)
	var seg Segment
	if bt != nil {
		seg = p.seg // read under t.mu
	}
	t.mu.Unlock()
	if bt == nil {
		return err
	}
	// Post returns when the submit call does, or once the batch was
	// reported InDoubt while the call still blocks: a host must not wait
	// minutes (Mooncake under a blackhole: the SYN retries of each
	// slice's connect; measured across two hosts, a Post cut only by the
	// caller's 5-minute bound). The call's late result is then settled by
	// submit under t.mu, its error swallowed (the InDoubt was the answer).
	done := make(chan error, 1)
	go func() { done <- t.submit(bt, seg, ws) }()
	select {
	case err := <-done:
		return err
	case <-bt.abandoned:
		return nil
	}
}

// admit checks, under t.mu, that the batch is new, its peer known and
// every op's source inside a registered region; it returns the writes
// with their sources filled in, and those regions.
func (t *Transport) admit(b sdk.Batch) (*peer, []Write, []*region, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, nil, nil, errdefs.Errorf(errdefs.FailedPrecondition, "Post: transport closed")
	}
	_, live := t.live[b.ID]
	if _, done := t.finished[b.ID]; live || done {
		return nil, nil, nil, errdefs.Errorf(errdefs.AlreadyExists, "Post: batch %d already posted", b.ID)
	}
	p := t.peers[b.Peer]
	if p == nil {
		return nil, nil, nil, errdefs.Errorf(errdefs.NotFound, "Post: peer %q", b.Peer)
	}
	ws := make([]Write, len(b.Ops))
	srcs := make([]*region, len(b.Ops))
	for i, op := range b.Ops {
		r, err := t.checkOp(op)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("Post: op %d: %w", i, err)
		}
		srcs[i] = r
		ws[i] = Write{Src: r.addr + uintptr(op.LocalOffset), Length: op.Length}
	}
	return p, ws, srcs, nil
}

// resolveDsts fills in each write's destination from its key's window,
// refusing an op that does not fit the window.
func (t *Transport) resolveDsts(p *peer, b sdk.Batch, ws []Write) error {
	for i, op := range b.Ops {
		w, err := t.resolve(p, op.RemoteKey)
		if err != nil {
			return fmt.Errorf("Post: op %d: %w", i, err)
		}
		if !inBounds(op.RemoteOffset, op.Length, w.n) {
			return errdefs.Errorf(errdefs.InvalidArgument, "Post: op %d: [%d,+%d) outside the %d-byte window of key %#x", i, op.RemoteOffset, op.Length, w.n, uint64(op.RemoteKey))
		}
		ws[i].Dst = w.addr + uintptr(op.RemoteOffset)
	}
	return nil
}

// enter records the batch live, its sources pinned, before the backend
// sees it. Called with t.mu held: the batch and its regions are checked
// again, since the lock was let go while keys were resolved. It returns
// nil where the batch needs no submit (the succeed-early variant).
func (t *Transport) enter(id sdk.BatchID, p *peer, ws []Write, srcs []*region) (*batch, error) {
	if _, dup := t.live[id]; dup || t.closed {
		return nil, errdefs.Errorf(errdefs.AlreadyExists, "Post: batch %d posted concurrently (or transport closed)", id)
	}
	for _, r := range srcs {
		if t.regions[r.id] != r {
			return nil, errdefs.Errorf(errdefs.NotFound, "Post: region %d deregistered meanwhile", r.id)
		}
	}
	bt := &batch{id: id, peer: p, srcs: srcs, confirms: p.confirms, posted: time.Now(), tasks: newTasks(ws)}
	for _, r := range srcs {
		r.pins++
	}
	if t.lieEarly(bt, ws) {
		return nil, nil
	}
	bt.pending, bt.submitting = true, true
	bt.abandoned = make(chan struct{})
	t.live[id] = bt
	return bt, nil
}

// submit hands the batch to the backend without holding t.mu: a library
// call may block for minutes (Mooncake's TCP transport connects to the
// peer inside submitTransfer, synchronously, so a blackholed link holds it
// for the kernel's SYN retries). Meanwhile the poller keeps running and
// reports the batch InDoubt at its report deadline (reportBlocked); the
// batch stays live, its sources pinned, until the call returns and every
// task was polled terminal.
func (t *Transport) submit(bt *batch, seg Segment, ws []Write) error {
	job, err := t.be.Submit(seg, ws)
	t.mu.Lock()
	defer t.mu.Unlock()
	bt.submitting = false
	var refused *SubmitRefused
	if errors.As(err, &refused) {
		job, bt.refused = refused.Job, refused.Err
		t.stats["submit_refused_after_call"]++
		t.log.Warn("the library refused a submit it had begun: part of the batch may have left; keeping it, its sources pinned, until every task ends", "batch", bt.id, "err", refused.Err)
	} else if err != nil {
		for _, r := range bt.srcs {
			r.pins--
		}
		delete(t.live, bt.id)
		if !bt.reported {
			return fmt.Errorf("Post: %s refused the batch (nothing was sent): %w", t.be.Name(), err)
		}
		// Its InDoubt already went out while the call blocked: that is
		// the batch's one completion (and it stays in doubt for Quiesce).
		t.finished[bt.id] = false
		return nil
	}
	bt.job, bt.pending = job, false
	t.stats["batches_posted"]++
	return nil
}

func newTasks(ws []Write) []Task {
	tasks := make([]Task, len(ws))
	for i, w := range ws {
		tasks[i] = Task{State: Waiting, Length: w.Length}
	}
	return tasks
}

func (t *Transport) checkOp(op sdk.Op) (*region, error) {
	switch {
	case op.Kind == sdk.OpRead:
		return nil, errdefs.Errorf(errdefs.Unimplemented, "reads are not supported by this plugin")
	case op.Kind != sdk.OpWrite:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "unknown op kind %d", op.Kind)
	case op.Length == 0:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "zero-length op")
	case op.Length > t.cfg.MaxOpBytes:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "op of %d bytes, at most %d", op.Length, t.cfg.MaxOpBytes)
	}
	r := t.regions[op.LocalRegion]
	if r == nil {
		return nil, errdefs.Errorf(errdefs.NotFound, "local region %d", op.LocalRegion)
	}
	if !inBounds(op.LocalOffset, op.Length, r.size) {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "[%d,+%d) outside local region %d of %d bytes", op.LocalOffset, op.Length, r.id, r.size)
	}
	return r, nil
}

func (t *Transport) resolve(p *peer, k sdk.Key) (window, error) {
	t.mu.Lock()
	w, ok := p.keys[k]
	t.mu.Unlock()
	if ok {
		return w, nil
	}
	w, err := p.dir.resolve(k)
	if err != nil {
		return w, err
	}
	// The key's memory may have been registered after Connect: reload the
	// peer's metadata before the first write under it.
	h, err := p.dir.hello()
	if err != nil {
		return w, err
	}
	seg, err := t.open(p.name, h.metadata)
	if err != nil {
		return w, err
	}
	t.mu.Lock()
	p.keys[k] = w
	p.seg = seg
	t.mu.Unlock()
	return w, nil
}

// open reloads a peer's segment for Post, waiting at most the report
// deadline: a library may block in the call (Mooncake's openSegment
// handshakes with the peer synchronously), and Post has no batch yet to
// report InDoubt, so without the bound the host waits as long as the link
// is down (measured across two hosts: a warm-up write after a blackhole
// held until the caller's 5-minute bound). Refusing is honest: nothing was
// submitted. The call's late result is dropped; the next Post opens again.
func (t *Transport) open(name string, metadata []byte) (Segment, error) {
	type opened struct {
		seg Segment
		err error
	}
	done := make(chan opened, 1)
	go func() {
		seg, err := t.be.Open(name, metadata)
		done <- opened{seg, err}
	}()
	select {
	case o := <-done:
		return o.seg, o.err
	case <-time.After(t.cfg.ReportAfter):
		return 0, errdefs.Errorf(errdefs.Unavailable, "Post: %s's open of peer %s has not returned after %v (the library blocks in it, e.g. connecting to an unreachable peer); nothing was submitted", t.be.Name(), name, t.cfg.ReportAfter)
	}
}

// poll walks the live jobs until Close.
func (t *Transport) poll() {
	defer close(t.done)
	tick := time.NewTicker(t.cfg.PollEvery)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		t.mu.Lock()
		live := make([]*batch, 0, len(t.live))
		var blocked []sdk.Completion
		for _, b := range t.live {
			if !b.pending {
				live = append(live, b)
			} else if c, ok := t.reportBlocked(b); ok {
				blocked = append(blocked, c)
			}
		}
		t.mu.Unlock()
		for _, c := range blocked {
			t.out <- c
		}
		for _, b := range live {
			t.step(b)
		}
	}
}

// reportBlocked is the InDoubt of a batch whose submit call has not
// returned by its report deadline: the library may already have sent part
// of it (nothing proves otherwise), and the host is owed a completion.
// Called with t.mu held.
func (t *Transport) reportBlocked(b *batch) (sdk.Completion, bool) {
	if !b.submitting || b.reported || time.Since(b.posted) < t.cfg.ReportAfter {
		return sdk.Completion{}, false
	}
	b.reported = true
	close(b.abandoned)
	t.stats["batches_reported_while_submitting"]++
	t.stats["batches_"+sdk.InDoubt.String()]++
	return sdk.Completion{Batch: b.id, Status: sdk.InDoubt, Class: errdefs.Unavailable,
		Detail: fmt.Sprintf("%s's submit call has not returned after %v (the library blocks in it, e.g. connecting to an unreachable peer); part of the batch may already have left; it stays pinned and is polled once the call returns", t.be.Name(), t.cfg.ReportAfter)}, true
}

// step polls one batch's unfinished tasks, reports it once its verdict is
// in, and frees it once every task is terminal.
func (t *Transport) step(b *batch) {
	all := true
	for i := range b.tasks {
		if b.tasks[i].State.Terminal() {
			continue
		}
		got, err := t.be.Poll(b.job, i)
		if err != nil {
			// A failed status read says nothing about the task: it is not
			// terminal (freeing the job now would free it under the NIC).
			t.mu.Lock()
			t.stats["poll_errors"]++
			t.mu.Unlock()
			all = false
			continue
		}
		got.Length = b.tasks[i].Length
		b.tasks[i] = got
		if !got.State.Terminal() {
			all = false
		}
	}
	if !b.reported {
		expired := time.Since(b.posted) >= t.cfg.ReportAfter
		if c, ok := t.verdict(b, expired); ok {
			c.Batch = b.id
			b.reported = true
			t.mu.Lock()
			t.stats["batches_"+c.Status.String()]++
			t.mu.Unlock()
			t.out <- c
		}
	}
	if !all {
		return
	}
	if err := t.be.Free(b.job); err != nil {
		t.mu.Lock()
		t.stats["free_refused"]++
		t.mu.Unlock()
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	clean := true
	for i, task := range b.tasks {
		r := b.srcs[i]
		r.pins--
		if b.refused != nil || !Clean(task, b.confirms) {
			r.tainted++
			clean = false
		}
	}
	delete(t.live, b.id)
	t.finished[b.id] = clean
}

// verdict is the configured verdict, except that a batch whose submit was
// refused part-way is never Succeeded: an older Mooncake reads a task it
// never posted COMPLETED, so "every task completed" proves nothing there.
// It waits for every task to be terminal (or the report deadline) first.
func (t *Transport) verdict(b *batch, expired bool) (sdk.Completion, bool) {
	c, ok := t.cfg.Verdict(b.tasks, b.confirms, expired)
	if !ok || b.refused == nil {
		return c, ok
	}
	c.BytesLanded = 0 // a COMPLETED task of such a batch may never have been posted
	if c.Status != sdk.Succeeded {
		return c, true
	}
	c.Status, c.Class = sdk.InDoubt, errdefs.Unavailable
	c.Detail = fmt.Sprintf("%s refused the submit part-way (%v); every task reads COMPLETED, which an older library also says of tasks it never posted", t.be.Name(), b.refused)
	return c, true
}

// quiesceWait bounds how long Quiesce waits for live batches to end.
const quiesceWait = 5 * time.Second

// Quiesce has evidence only for batches every task of which ended with a
// confirmed completion; it waits a little (quiesceWait, or the caller's
// deadline) for live ones to end first. For any other batch this backend
// has none: it cannot cancel, its failures do not stop bytes, and its
// deregistration does not revoke. The way to stop such a batch is to end
// the target's plugin process (the host's process-exited evidence).
func (t *Transport) Quiesce(ctx context.Context, id sdk.PeerID, ids []sdk.BatchID) (sdk.QuiesceResult, error) {
	end := time.Now().Add(quiesceWait)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		end = d
	}
	for {
		doubt, live, err := t.judge(id, ids)
		if err != nil {
			return sdk.QuiesceResult{}, err
		}
		if len(doubt) == 0 {
			return sdk.QuiesceResult{Evidence: sdk.EvidenceCompletionsHarvested, Batches: ids, Detail: "every task confirmed applied by the target"}, nil
		}
		if live == 0 || time.Now().After(end) {
			return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.Unavailable, "Quiesce: %s cannot cancel or revoke, and batches %v did not confirm every task; only ending the target's plugin process stops their bytes", t.be.Name(), doubt)
		}
		time.Sleep(t.cfg.PollEvery * 10)
	}
}

// judge lists the batches without evidence and how many are still live.
func (t *Transport) judge(id sdk.PeerID, ids []sdk.BatchID) (doubt []sdk.BatchID, live int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, bid := range ids {
		if b, ok := t.live[bid]; ok {
			if b.peer.id != id {
				return nil, 0, errdefs.Errorf(errdefs.InvalidArgument, "Quiesce: batch %d was not posted to %q", bid, id)
			}
			doubt = append(doubt, bid)
			live++
			continue
		}
		clean, ok := t.finished[bid]
		if !ok {
			return nil, 0, errdefs.Errorf(errdefs.NotFound, "Quiesce: batch %d unknown", bid)
		}
		if !clean {
			doubt = append(doubt, bid)
		}
	}
	return doubt, live, nil
}
