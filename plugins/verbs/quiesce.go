package verbs

// This file: Quiesce, the only path to endpoint-flushed evidence.

import (
	"context"
	"fmt"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// Quiesce moves every QP that carries (or carried, with an error) one of
// the batches to ERROR, waits until the polling loop has harvested every
// completion of it, flushes included, and destroys it; only then is nothing
// posted on it able to move. Evidence: endpoint-flushed. If every listed
// batch had already completed on a healthy QP: completions-harvested.
func (t *Transport) Quiesce(ctx context.Context, id sdk.PeerID, batches []sdk.BatchID) (sdk.QuiesceResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.peers[id]
	if !ok {
		return sdk.QuiesceResult{}, errdefs.Errorf(errdefs.NotFound, "verbs: peer %s", id)
	}
	flush := t.toFlushLocked(batches)
	res := sdk.QuiesceResult{Evidence: sdk.EvidenceCompletionsHarvested, Batches: append([]sdk.BatchID(nil), batches...)}
	if len(flush) == 0 {
		return res, nil
	}
	if err := t.startFlushLocked(p, flush); err != nil {
		return sdk.QuiesceResult{}, err
	}
	if err := t.awaitFlushedLocked(ctx, p, flush); err != nil {
		return sdk.QuiesceResult{}, err
	}
	for c := range flush {
		t.destroyLocked(c)
	}
	kept := p.old[:0]
	for _, c := range p.old {
		if !c.destroyed {
			kept = append(kept, c)
		}
	}
	p.old = kept
	res.Evidence = sdk.EvidenceEndpointFlushed
	res.Detail = fmt.Sprintf("%d queue pair(s) moved to ERROR, every completion harvested, destroyed", len(flush))
	t.stats["quiesce_flushes"]++
	return res, nil
}

// toFlushLocked lists the live QPs on which one of the batches is pending
// or which an error left in ERROR.
func (t *Transport) toFlushLocked(batches []sdk.BatchID) map[*conn]bool {
	flush := map[*conn]bool{}
	for _, b := range batches {
		c := t.owner[b]
		if c == nil || c.destroyed {
			continue
		}
		if c.ep.pending(b) || c.broken {
			flush[c] = true
		}
	}
	return flush
}

// startFlushLocked retires each QP from new batches (the peer reconnects
// lazily on its next Post) and moves it to ERROR, so that the device flushes
// every work request still on it.
func (t *Transport) startFlushLocked(p *peer, flush map[*conn]bool) error {
	for c := range flush {
		if p.cur == c {
			p.cur = nil
			p.old = append(p.old, c)
		}
		c.broken = true
		t.emitLocked(c.ep.beginFlush()...)
		if err := c.qp.toError(); err != nil {
			return errdefs.Errorf(errdefs.Unavailable, "verbs: quiesce %s: %v", p.id, err)
		}
	}
	return nil
}

// awaitFlushedLocked waits until the polling loop has harvested every
// completion of the QPs, flushes included: MaxTail plus 10 s at most, or
// the context's deadline if sooner.
func (t *Transport) awaitFlushedLocked(ctx context.Context, p *peer, flush map[*conn]bool) error {
	deadline := time.Now().Add(t.cfg.MaxTail() + 10*time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	timer := time.AfterFunc(time.Until(deadline), func() { t.mu.Lock(); t.changed.Broadcast(); t.mu.Unlock() })
	defer timer.Stop()
	for {
		all := true
		for c := range flush {
			all = all && c.ep.drained()
		}
		if all {
			return nil
		}
		if t.closed || !time.Now().Before(deadline) {
			return errdefs.Errorf(errdefs.Unavailable, "verbs: quiesce %s: flush completions did not all arrive; batches stay in doubt", p.id)
		}
		t.changed.Wait()
	}
}
