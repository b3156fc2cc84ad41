package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

func revocationGroup() group {
	return group{name: "revocation", needs: func(s *suite) string {
		if !s.info.Capabilities.Revoke {
			return "the plugin does not claim Revoke"
		}
		return ""
	}, checks: []check{
		{"write-after-revoke-fails", PromiseRevoke, checkRevokeThenWrite},
		{"revoke-mid-stream", PromiseRevoke, checkRevokeMidStream},
		{"writer-bound-key", PromiseWriterBound, checkWriterBoundKey},
	}}
}

// checkRevokeThenWrite: after Revoke returns, a write under the key fails at
// the initiator and the target memory is untouched for the guard window.
func checkRevokeThenWrite(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	const off, n = 4096, 64 << 10
	k, err := se.grant(ctx, off, n, 0x0F)
	if err != nil {
		return err
	}
	c, err := se.postWait(ctx, se.write(k, 0, 0, n))
	if err != nil || c.Status != sdk.Succeeded {
		return healthy("write before Revoke", c, err)
	}
	res, err := se.tgt.g.Revoke(ctx, k)
	if err != nil {
		return fmt.Errorf("Revoke: %w", err)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("revoke: applied %d, dropped %d", res.WritesApplied, res.WritesDropped))
	se.fillDst(off, off+n, 0x0F)
	b := se.write(k, 8192, 0, n)
	if err := se.ini.t.Post(ctx, b); err == nil {
		c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
		if err != nil {
			r.Promise = PromiseOneCompletion
			return err
		}
		if c.Status == sdk.Succeeded {
			if err := mismatch(se.dstAt(off, off+n), se.src.Bytes()[8192:8192+n]); err != nil {
				return broke(PromiseSucceeded, fmt.Errorf("a write under a revoked key reported Succeeded without its bytes: %w", err))
			}
			return fmt.Errorf("a write under a revoked key landed and reported Succeeded: Revoke revoked nothing")
		}
		if c.Status == sdk.InDoubt {
			if _, err := se.quiesce(ctx, b.ID); err != nil {
				r.Notes = append(r.Notes, "Quiesce after the refused write: "+err.Error())
			}
		}
	}
	if ch := se.dst.watch(0, se.size).until(s.guard); ch != nil {
		return fmt.Errorf("target memory changed after Revoke returned: %v", ch)
	}
	if err := untouched(se.dstAt(off, off+n), 0x0F); err != nil {
		return fmt.Errorf("a write under a revoked key landed: %w", err)
	}
	if _, err := se.tgt.g.Revoke(ctx, k); err != nil {
		return fmt.Errorf("a second Revoke must be a no-op: %w", err)
	}
	return nil
}

// checkRevokeMidStream: Revoke while a large batch streams into the window;
// from the moment Revoke returns, nothing may change.
func checkRevokeMidStream(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	const off, n = 4096, 4 << 20
	k, err := se.grant(ctx, off, n, 0x1E)
	if err != nil {
		return err
	}
	if se.proxy != nil {
		se.proxy.SetDelay(500 * time.Microsecond) // keep the stream going while we revoke
		defer se.proxy.SetDelay(0)
	}
	b := se.split(k, 0, 0, n, 64<<10)
	if err := se.ini.t.Post(ctx, b); err != nil {
		return err
	}
	// Revoke once the first bytes landed (or after a moment).
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(time.Millisecond) {
		if se.dstAt(off, off+1)[0] != 0x1E || se.dstAt(off+1, off+1+1)[0] != 0x1E {
			break
		}
	}
	if _, err := se.tgt.g.Revoke(ctx, k); err != nil {
		return fmt.Errorf("Revoke mid-stream: %w", err)
	}
	if ch := se.dst.watch(0, se.size).until(s.guard); ch != nil {
		// The batch's completion is awaited first: arriving during the
		// next check, after it refilled this memory, it would be judged
		// there as a Succeeded without its bytes.
		_, _ = se.wait(b.ID, s.cfg.CompletionTimeout)
		return fmt.Errorf("target memory changed after Revoke returned: %v", ch)
	}
	c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
	if err != nil {
		r.Promise = PromiseOneCompletion
		return err
	}
	r.Notes = append(r.Notes, fmt.Sprintf("batch %v (%s)", c.Status, c.Detail))
	if c.Status == sdk.Succeeded {
		if err := mismatch(se.dstAt(off, off+n), se.src.Bytes()[:n]); err != nil {
			r.Promise = PromiseSucceeded
			return fmt.Errorf("Succeeded though revoked mid-stream: %w", err)
		}
	}
	if c.Status == sdk.InDoubt {
		_, _ = se.quiesce(ctx, b.ID)
	}
	return nil
}
