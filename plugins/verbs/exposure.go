package verbs

// This file: the receiving side's exposures. Every key is its own MR or
// memory window over exactly its window; Revoke returns once the device
// refuses the old key.

import (
	"context"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

type grant struct {
	region  sdk.RegionID
	off, n  uint64
	mr      *mr
	mw      *mw
	bound   *binding // type-2 window: bound to one writer's responder QP
	revoked bool
}

// Grant exposes one window under a new key: a type-2 window bound to its
// writer's QP, a type-1 window, or an MR of its own (Config.Revoke).
func (t *Transport) Grant(ctx context.Context, w sdk.Window) (sdk.Key, error) {
	if w.Pieced() {
		return 0, errdefs.Errorf(errdefs.Unimplemented, "verbs: a pieced window (stride %d, piece %d): a key is one contiguous MR or memory window (bounds window); grant one key per piece", w.Stride, w.Piece)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.regions[w.Region]
	if !ok {
		return 0, errdefs.Errorf(errdefs.NotFound, "verbs: region %d", w.Region)
	}
	if w.Length == 0 || w.Offset+w.Length < w.Offset || w.Offset+w.Length > r.desc.Size || w.Length > maxOpBytes*64 {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "verbs: window [%d,+%d) outside region of %d bytes", w.Offset, w.Length, r.desc.Size)
	}
	g := &grant{region: w.Region, off: w.Offset, n: w.Length}
	iova := r.localAddr(w.Offset) & 0xfff
	rkey, err := t.exposeLocked(r, w, g, iova)
	if err != nil {
		return 0, err
	}
	var k sdk.Key
	for {
		k = makeKey(rkey, iova, randomNonce())
		if _, dup := t.grants[k]; !dup {
			break
		}
	}
	t.grants[k] = g
	r.grants[k] = true
	t.stats["grants"]++
	if g.bound != nil {
		t.stats["grants_mw2"]++
	}
	return k, nil
}

// exposeLocked registers g's MR (and window) over w and returns the rkey a
// writer uses. On error nothing of g is left registered.
func (t *Transport) exposeLocked(r *region, w sdk.Window, g *grant, iova uint64) (uint32, error) {
	addr := r.localAddr(w.Offset)
	register := func(acc int) (*mr, error) {
		if r.dmabuf != nil {
			return t.d.regDMABuf(int(r.dmabuf.Fd()), r.desc.Offset+w.Offset, w.Length, iova, acc)
		}
		return t.d.regMR(uintptr(addr), w.Length, iova, acc)
	}
	var err error
	switch {
	case w.Writer != "" && t.writerBound():
		if g.mr, err = register(accLocalWrite | accMWBind); err != nil {
			return 0, err
		}
		return t.exposeToWriterLocked(w, g, iova)
	case t.mode == RevokeMR:
		if g.mr, err = register(accLocalWrite | accRemoteWrite | accRemoteRead); err != nil {
			return 0, err
		}
		return g.mr.rkey(), nil
	case t.mode == RevokeMW1:
		// The MR itself grants no remote access: only the window does.
		if g.mr, err = register(accLocalWrite | accMWBind); err != nil {
			return 0, err
		}
		return t.exposeMW1Locked(w, g, iova)
	}
	return 0, nil
}

// exposeToWriterLocked binds a type-2 window over g's MR on the responder
// QP of w's writer.
func (t *Transport) exposeToWriterLocked(w sdk.Window, g *grant, iova uint64) (uint32, error) {
	var err error
	if g.mw, err = t.d.allocMW2(); err != nil {
		_ = g.mr.dereg()
		return 0, err
	}
	var rkey uint32
	if g.bound, rkey, err = t.bindToWriter(w.Writer, g.mw, g.mr, iova, w.Length); err != nil {
		_ = g.mw.dealloc()
		_ = g.mr.dereg()
		return 0, err
	}
	return rkey, nil
}

// exposeMW1Locked binds a type-1 window over g's MR.
func (t *Transport) exposeMW1Locked(w sdk.Window, g *grant, iova uint64) (uint32, error) {
	var err error
	if g.mw, err = t.d.allocMW1(); err != nil {
		_ = g.mr.dereg()
		return 0, err
	}
	rkey, err := t.d.bindMW1(g.mw, g.mr, iova, w.Length, accRemoteWrite|accRemoteRead)
	if err != nil {
		_ = g.mw.dealloc()
		_ = g.mr.dereg()
		return 0, err
	}
	return rkey, nil
}

// writerBound: keys can be bound to one writer (type-2 windows).
func (t *Transport) writerBound() bool { return t.inf.MW2A || t.inf.MW2B }

// bindToWriter binds a type-2 window through the responder QP of writer's
// one connection. It holds amu, so that connection cannot be retired
// half-way through.
func (t *Transport) bindToWriter(writer string, m *mw, r *mr, iova, n uint64) (*binding, uint32, error) {
	t.amu.Lock()
	defer t.amu.Unlock()
	var on *responder
	count, broken := 0, 0
	for _, a := range t.accepts {
		switch {
		case a.from != writer:
		case a.q.broken(): // it refused a write; the writer reconnects on its next post
			broken++
		default:
			on = a
			count++
		}
	}
	switch {
	case count == 0 && broken > 0:
		return nil, 0, errdefs.Errorf(errdefs.FailedPrecondition, "verbs: writer %q's connection here is in error (it refused a write); the writer reconnects on its next post", writer)
	case count == 0:
		return nil, 0, errdefs.Errorf(errdefs.FailedPrecondition, "verbs: writer %q is not connected", writer)
	case count > 1:
		return nil, 0, errdefs.Errorf(errdefs.FailedPrecondition, "verbs: writer %q has %d connections here; a key binds to one", writer, count)
	}
	rkey, err := t.d.bindMW2(on.q, m, r, iova, n, accRemoteWrite|accRemoteRead)
	if err != nil {
		return nil, 0, err
	}
	b := &binding{rkey: rkey, live: true, on: on}
	on.bound[b] = true
	return b, rkey, nil
}

func (t *Transport) Revoke(ctx context.Context, k sdk.Key) (sdk.RevokeResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.grants[k]; !ok {
		return sdk.RevokeResult{}, errdefs.Errorf(errdefs.NotFound, "verbs: key %#x", uint64(k))
	}
	return sdk.RevokeResult{}, t.revokeLocked(k)
}

// revokeLocked makes the device refuse k: the window is unbound (mw1) or the
// MR deregistered (mr); both return only once the device has stopped
// accepting the rkey. Writes that arrive later end at their sender with a
// remote access error. The device does not count them for us.
func (t *Transport) revokeLocked(k sdk.Key) error {
	g := t.grants[k]
	if g.revoked {
		return nil
	}
	if g.bound != nil {
		// LOCAL_INV, then free the window; if LOCAL_INV fails, freeing the
		// window (ibv_dealloc_mw) invalidates it all the same.
		t.amu.Lock()
		if err := t.invalidateLocked(g.bound); err != nil {
			t.log.Warn("LOCAL_INV failed; freeing the window instead", "error", err)
		}
		if err := g.mw.dealloc(); err != nil {
			t.amu.Unlock()
			return err
		}
		g.bound.live = false
		delete(g.bound.on.bound, g.bound)
		t.amu.Unlock()
		g.mw = nil
	}
	if g.mw != nil {
		if _, err := t.d.bindMW1(g.mw, g.mr, 0, 0, 0); err != nil {
			return err
		}
		if err := g.mw.dealloc(); err != nil {
			return err
		}
		g.mw = nil
	}
	if err := g.mr.dereg(); err != nil {
		return err
	}
	g.revoked = true
	if r, ok := t.regions[g.region]; ok {
		delete(r.grants, k)
	}
	if g.bound != nil {
		t.stats["revokes_mw2"]++
	} else {
		t.stats["revokes_"+string(t.mode)]++
	}
	return nil
}
