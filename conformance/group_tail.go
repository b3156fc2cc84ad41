package conformance

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// tailGroup measures the tail instead of trusting the claim: the core
// releases an aborted exposure on a timeout of lease + MaxTail, so a byte
// landing later than a completion + MaxTail lands in memory that may
// already belong to another request. Each check provokes an InDoubt or
// FailedDefinite completion under a real fault, then restores the link at
// several offsets after the completion and watches target memory WITHOUT
// calling Quiesce. Bytes after an InDoubt are judged against MaxTail;
// any byte after a FailedDefinite breaks that promise (nothing more moves).
// The tail measured in a failing application is recorded too.
func tailGroup() group {
	return group{name: "tail", needs: needsGranter, checks: []check{
		{"link-restored-late", PromiseMaxTail, checkTail(func(s *suite) (fault, string) {
			if why := needsLinkFaults(s); why != "" {
				return fault{}, why
			}
			f, _, err := s.main.linkFault("stall")
			if err != nil {
				return fault{}, err.Error()
			}
			return f, ""
		})},
		{"target-resumed-late", PromiseMaxTail, checkTail(func(s *suite) (fault, string) { return stopFault(s.main.tgt), "" })},
		{"netem-restored-late", PromiseMaxTail, checkTail(func(s *suite) (fault, string) {
			if s.shaper != nil && s.shaper.err != nil {
				return fault{}, netemMissing(s)
			}
			if !s.netemOK() {
				return fault{}, "needs --netns or --netem-dev with tc netem"
			}
			return s.shaper.fault("loss 100%"), ""
		})},
	}}
}

// tailOffsets: when, after the completion, the fault is lifted — at once,
// half-way through the declared tail, and past it (bytes released then
// must never land).
func tailOffsets(maxTail time.Duration) []time.Duration {
	return []time.Duration{0, maxTail / 2, maxTail + maxTail/4}
}

func checkTail(faultFor func(*suite) (fault, string)) func(context.Context, *suite, *Result) error {
	return func(ctx context.Context, s *suite, r *Result) error {
		if _, why := faultFor(s); why != "" {
			return errSkip("%s", why)
		}
		measured := 0
		if s.watchedTail() < s.info.Capabilities.MaxTail {
			r.Notes = append(r.Notes, fmt.Sprintf("declared MaxTail %v is longer than the suite watches (%v): the tail is declared unbounded, not measured past %v",
				s.info.Capabilities.MaxTail, s.cfg.MaxWatch, s.cfg.MaxWatch))
		}
		for _, off := range tailOffsets(s.watchedTail()) {
			// Each offset's batch on memory no earlier batch in doubt
			// can still write to: the tail measured is its own.
			if err := s.renewMain(ctx, r); err != nil {
				return err
			}
			f, _ := faultFor(s)
			tail, ok, err := s.main.lateBytes(ctx, r, f, off)
			// The tail is recorded before the verdict: a failed tail check
			// is exactly where the measured tail matters.
			if tail > s.worstTail {
				s.worstTail = tail
			}
			if err != nil {
				return fmt.Errorf("fault lifted %v after the completion: %w", off.Round(time.Millisecond), err)
			}
			if ok {
				measured++
			}
		}
		if measured == 0 {
			// Succeeded with every byte verified (one-sided RDMA writes do
			// not need a stopped target's CPU): this fault cannot provoke a
			// tail here. The group still needs a tail measured by another.
			return errNotApplicable("the plugin completed Succeeded, bytes verified, under every application of this fault: no tail to measure")
		}
		return nil
	}
}

// lateBytes provokes one non-Succeeded completion under f, lifts f off
// after the completion, and watches target memory until the declared
// tail (or the lift, if later) plus the guard floor has passed. It returns
// the latest landing seen after the completion (0 if none) and whether a
// non-Succeeded completion was obtained.
func (se *session) lateBytes(ctx context.Context, r *Result, f fault, off time.Duration) (time.Duration, bool, error) {
	s := se.s
	const dstOff, n = 64 << 10, 256 << 10
	k, err := se.grant(ctx, dstOff, n, 0xD7)
	if err != nil {
		return 0, false, err
	}
	defer se.tgt.g.Revoke(ctx, k)
	if err := se.warm(ctx, k); err != nil {
		return 0, false, err
	}
	se.fillDst(dstOff, dstOff+n, 0xD7)
	var once sync.Once
	release := func() { once.Do(f.release) }
	defer release()
	r.usedFault(f.name)
	if err := f.apply(); err != nil {
		return 0, false, fmt.Errorf("fault %s not applied: %w", f.name, err)
	}
	b := se.split(k, 4321, 0, n, 64<<10)
	if err := se.ini.t.Post(ctx, b); err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("%s: Post refused: %v", f.name, err))
		return 0, false, nil
	}
	c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
	if err != nil {
		return 0, false, err
	}
	// The snapshot is taken at the completion, before the fault is lifted.
	w, watched := se.dst.watch(0, se.size), time.Now()
	if c.Status == sdk.Succeeded {
		release()
		r.Notes = append(r.Notes, fmt.Sprintf("%s: Succeeded (no tail to measure)", f.name))
		if err := mismatch(se.dstAt(dstOff, dstOff+n), se.src.Bytes()[4321:4321+n]); err != nil || f.carried == nil {
			return 0, false, broke(PromiseSucceeded, err)
		}
		return 0, false, f.carried(n)
	}
	lift := time.AfterFunc(off, release)
	defer lift.Stop()
	maxTail := s.info.Capabilities.MaxTail
	last := w.latest(max(off, s.watchedTail()) + s.cfg.GuardFloor)
	release()
	last = laterStill(se, f, watched, last)
	if c.Status == sdk.InDoubt {
		// Only now, to leave the peer clean for the next check; the
		// measurement above never relied on it.
		_, _ = se.quiesce(ctx, b.ID)
	}
	if last == nil {
		r.Notes = append(r.Notes, fmt.Sprintf("%s, lifted at +%v: %v, nothing landed after the completion", f.name, off.Round(time.Millisecond), c.Status))
		return 0, true, nil
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%s, lifted at +%v: %v, last byte landed %v after the completion (MaxTail %v)",
		f.name, off.Round(time.Millisecond), c.Status, last.After.Round(time.Millisecond), maxTail))
	if c.Status == sdk.FailedDefinite {
		// FailedDefinite promises that nothing more moves: MaxTail bounds
		// InDoubt bytes, not these.
		return last.After, true, broke(PromiseFailed, fmt.Errorf("FailedDefinite completion, fault lifted %v after it: bytes landed %v after the completion (%v)",
			off.Round(time.Millisecond), last.After.Round(time.Millisecond), last))
	}
	if last.After > maxTail {
		return last.After, true, fmt.Errorf("%v completion, fault lifted %v after it, no Quiesce: bytes landed %v after the completion, past the declared MaxTail %v (%v)",
			c.Status, off.Round(time.Millisecond), last.After.Round(time.Millisecond), maxTail, last)
	}
	return last.After, true, nil
}

// laterStill extends a tail watch begun at start by what f says its held
// back bytes may still take to land once released (TCP's retransmission
// timer after a blackhole), and returns the last change seen, timed from
// start.
func laterStill(se *session, f fault, start time.Time, last *change) *change {
	if f.settle == nil || f.settle() <= 0 {
		return last
	}
	w, from := se.dst.watch(0, se.size), time.Since(start)
	if l := w.latest(f.settle()); l != nil {
		l.After += from
		return l
	}
	return last
}

// latest watches until d after the snapshot and reports the last change
// seen (nil if none), timed from the snapshot.
func (w *watcher) latest(d time.Duration) *change {
	var last *change
	snap := append([]byte(nil), w.snap...)
	for {
		if !bytes.Equal(snap, w.mem) {
			last = firstDiff(snap, w.mem, time.Since(w.start))
			copy(snap, w.mem)
		}
		if time.Since(w.start) >= d {
			return last
		}
		time.Sleep(watchEvery)
	}
}
