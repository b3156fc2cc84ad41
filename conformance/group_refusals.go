package conformance

import (
	"context"
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// refusalsGroup: writes the target must refuse. The outcome is checked, not
// only the call: the batch is never Succeeded, a definite failure carries
// the class the contract gives the refusal, and nothing lands.
func refusalsGroup() group {
	return group{name: "remote-refusals", needs: needsGranter, checks: []check{
		{"unknown-key", PromiseErrorClass, checkRefusedUnknownKey},
		{"out-of-window", PromiseErrorClass, checkRefusedOutOfWindow},
		{"revoked-key", PromiseErrorClass, checkRefusedRevokedKey},
	}}
}

// The class of each target-side refusal, at Post or in a FailedDefinite
// completion: an unknown key is not found, a write past the window is an
// invalid argument, a revoked key is a failed precondition. A target may
// answer an unknown key as it answers a revoked one (the tcp plugin does:
// one answer, so a guesser cannot tell which keys ever existed), so an
// unknown key may also be a failed precondition (sameAnswer).
const (
	classUnknownKey  = errdefs.NotFound
	classOutOfWindow = errdefs.InvalidArgument
	classRevokedKey  = errdefs.FailedPrecondition
)

// refused posts b, which the target must refuse, and judges the outcome:
// a Post refusal or a FailedDefinite completion must carry want; InDoubt is
// honest (the batch is quiesced); Succeeded is a lie. watched must keep its
// sentinel for the guard window. landed is the promise a Succeeded breaks
// when its bytes did land: for a revoked key that is Revoke's promise (the
// write was true to its bytes; the Revoke before it revoked nothing), not
// Succeeded's.
func (se *session) refused(ctx context.Context, r *Result, b sdk.Batch, want errdefs.Class, lo, hi uint64, sentinel byte, landed string) error {
	s := se.s
	if err := se.ini.t.Post(ctx, b); err != nil {
		if got := errdefs.ClassOf(err); !sameAnswer(got, want) {
			return fmt.Errorf("refused at Post with class %v (%v), want %v", got, err, want)
		}
		r.Notes = append(r.Notes, "refused at Post: "+err.Error())
	} else {
		c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
		if err != nil {
			return err
		}
		r.Notes = append(r.Notes, fmt.Sprintf("completed %v, class %v (%s)", c.Status, c.Class, c.Detail))
		switch c.Status {
		case sdk.Succeeded:
			if err := untouched(se.dstAt(lo, hi), sentinel); err != nil {
				return broke(landed, fmt.Errorf("a write the target must refuse landed and reported Succeeded: %w", err))
			}
			return broke(PromiseSucceeded, fmt.Errorf("a write the target must refuse reported Succeeded, and none of its bytes landed"))
		case sdk.FailedDefinite:
			if !sameAnswer(c.Class, want) {
				return fmt.Errorf("the target refused the write; the completion says class %v (%s), want %v", c.Class, c.Detail, want)
			}
		default:
			if _, err := se.quiesce(ctx, b.ID); err != nil {
				r.Notes = append(r.Notes, "Quiesce: "+err.Error())
			}
		}
	}
	if ch := se.dst.watch(lo, hi-lo).until(s.guard); ch != nil {
		return broke(PromiseFailed, fmt.Errorf("a refused write changed target memory: %v", ch))
	}
	return broke(PromiseFailed, untouched(se.dstAt(lo, hi), sentinel))
}

// sameAnswer: got is the refusal's class want, or — for an unknown key —
// the revoked key's class.
func sameAnswer(got, want errdefs.Class) bool {
	return got == want || (want == classUnknownKey && got == classRevokedKey)
}

func checkRefusedUnknownKey(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	k, err := se.grant(ctx, 4096, 64<<10, 0x3A)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	if err := se.warm(ctx, k); err != nil {
		return err
	}
	se.fillDst(0, se.size, 0x3A)
	unknown := k ^ 0x5a5a5a5a5a5a5a5a
	return se.refused(ctx, r, se.write(unknown, 0, 0, 4096), classUnknownKey, 0, se.size, 0x3A, PromiseSucceeded)
}

func checkRefusedOutOfWindow(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	const off, n = 64 << 10, 8192
	k, err := se.grant(ctx, off, n, 0x3B)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	if err := se.warm(ctx, k); err != nil {
		return err
	}
	se.fillDst(off, off+n, 0x3B)
	// Starts inside the window, ends past it.
	return se.refused(ctx, r, se.write(k, 0, n/2, n), classOutOfWindow, off-4096, off+n+4096, 0x3B, PromiseSucceeded)
}

func checkRefusedRevokedKey(ctx context.Context, s *suite, r *Result) error {
	if err := notRevoking(s); err != nil {
		return err
	}
	se := s.main
	const off, n = 64 << 10, 8192
	k, err := se.grant(ctx, off, n, 0x3C)
	if err != nil {
		return err
	}
	if err := se.warm(ctx, k); err != nil {
		return err
	}
	if _, err := se.tgt.g.Revoke(ctx, k); err != nil {
		return fmt.Errorf("Revoke: %w", err)
	}
	se.fillDst(off-4096, off+n+4096, 0x3C)
	return se.refused(ctx, r, se.write(k, 0, 0, n), classRevokedKey, off-4096, off+n+4096, 0x3C, PromiseRevoke)
}
