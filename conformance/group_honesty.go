package conformance

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

func honestyGroup() group {
	return group{name: "failure-honesty", needs: needsGranter, checks: []check{
		{"succeeded-is-final", PromiseSucceeded, checkSucceededFinal},
		{"link-delayed", PromiseSucceeded, linkFaultCheck("delay")},
		{"link-stalled", PromiseFailed, linkFaultCheck("stall")},
		{"link-stalled-quiesce-at-once", PromiseQuiesce, checkStallQuiesceNow},
		{"link-lossy", PromiseFailed, linkFaultCheck("drop")},
		{"link-reset", PromiseFailed, linkFaultCheck("reset")},
		{"netem-delay-loss", PromiseFailed, checkNetem},
		{"target-stopped", PromiseFailed, checkTargetStopped},
		{"target-memory-deregistered", PromiseDeregister, checkDstDeregistered},
		{"target-killed", PromiseSucceeded, checkTargetKilled},
	}}
}

const honestyWin = 1 << 20

// honest posts a batch of n bytes into a sentinel-filled window while f
// holds and judges what the plugin reports:
//   - Succeeded: the bytes must be there at once, and nothing may change for
//     the guard window after;
//   - FailedDefinite: the fault is released and nothing may change for the
//     guard window (bytes of a "failed" batch still arriving is the lie);
//   - InDoubt: honest; the suite asks Quiesce, and after it returns with
//     evidence nothing may change for the guard window.
func (se *session) honest(ctx context.Context, r *Result, f fault, n uint64, during func()) error {
	s := se.s
	const off = 64 << 10
	k, err := se.grant(ctx, off, n, 0xA7)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	if err := se.warm(ctx, k); err != nil {
		return err
	}
	se.fillDst(off, off+n, 0xA7)
	released := false
	release := func() {
		if !released {
			released = true
			f.release()
		}
	}
	r.usedFault(f.name)
	if err := f.apply(); err != nil {
		release()
		return fmt.Errorf("fault %s not applied: %w", f.name, err)
	}
	defer release()
	b := se.split(k, 999, 0, n, 64<<10)
	if err := se.ini.t.Post(ctx, b); err != nil {
		release()
		if ch := se.dst.watch(0, se.size).until(s.guard); ch != nil {
			r.Promise = PromiseErrorClass
			return fmt.Errorf("Post refused (%v), yet target memory changed: %v", err, ch)
		}
		r.Notes = append(r.Notes, "Post refused under the fault: "+err.Error())
		return f.reachedBy(n)
	}
	if during != nil {
		during()
	}
	c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
	if err != nil {
		r.Promise = PromiseOneCompletion
		return err
	}
	r.Notes = append(r.Notes, fmt.Sprintf("reported %v (%s)", c.Status, c.Detail))
	if err := se.judgeUnderFault(ctx, r, f, c, off, n, release); err != nil {
		return err
	}
	if n := se.count(b.ID); n != 1 {
		r.Promise = PromiseOneCompletion
		return fmt.Errorf("batch %d: %d completions", b.ID, n)
	}
	return nil
}

// judgeUnderFault judges c, the completion of honest's batch (the bytes
// from 999 of the source into [off,+n)), and releases the fault at the
// moment each verdict's promise takes effect.
func (se *session) judgeUnderFault(ctx context.Context, r *Result, f fault, c sdk.Completion, off, n uint64, release func()) error {
	guard := se.s.guard
	switch c.Status {
	case sdk.Succeeded:
		if err := mismatch(se.dstAt(off, off+n), se.src.Bytes()[999:999+n]); err != nil {
			r.Promise = PromiseSucceeded
			return fmt.Errorf("reported Succeeded under the fault, but the target does not hold the bytes: %w", err)
		}
		w := se.dst.watch(0, se.size)
		release()
		if ch := w.until(f.watchAfter(guard)); ch != nil {
			r.Promise = PromiseSucceeded
			return fmt.Errorf("target memory changed after Succeeded: %v", ch)
		}
		if f.carried != nil {
			return f.carried(n)
		}
		return nil
	case sdk.FailedDefinite:
		w := se.dst.watch(0, se.size)
		release()
		if ch := w.until(f.watchAfter(guard)); ch != nil {
			r.Promise = PromiseFailed
			return fmt.Errorf("reported FailedDefinite, but bytes kept landing: %v", ch)
		}
		return f.reachedBy(n)
	}
	return se.judgeInDoubt(ctx, r, f, c.Batch, n, release)
}

// judgeInDoubt: an InDoubt batch is honest; Quiesce must then cover it, and
// nothing may land after Quiesce returns.
func (se *session) judgeInDoubt(ctx context.Context, r *Result, f fault, id sdk.BatchID, n uint64, release func()) error {
	if !f.underFault {
		release()
	}
	q, qerr := se.quiesce(ctx, id)
	if qerr != nil {
		release()
		r.Notes = append(r.Notes, fmt.Sprintf("Quiesce could not obtain evidence (%v): honest, the batch stays in doubt", qerr))
		return f.reachedBy(n)
	}
	w := se.dst.watch(0, se.size)
	if e := quiesceCovers(q, id); e != nil {
		r.Promise = PromiseQuiesce
		return e
	}
	release()
	if ch := w.until(f.watchAfter(se.s.guard)); ch != nil {
		r.Promise = PromiseQuiesce
		return fmt.Errorf("Quiesce returned %s evidence, but bytes kept landing: %v", q.Evidence, ch)
	}
	return f.reachedBy(n)
}

func quiesceCovers(q sdk.QuiesceResult, id sdk.BatchID) error {
	if q.Evidence == "" {
		return fmt.Errorf("Quiesce returned without evidence")
	}
	if !slices.Contains(q.Batches, id) {
		return fmt.Errorf("Quiesce evidence %s does not cover batch %d", q.Evidence, id)
	}
	return nil
}

// checkSucceededFinal: on a healthy link, a large single write; Succeeded
// must mean the bytes are there at that moment and stay.
func checkSucceededFinal(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	n := min(uint64(honestyWin), s.info.Capabilities.MaxOpBytes)
	k, err := se.grant(ctx, 4096, n, 0x5C)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	c, err := se.postWait(ctx, se.write(k, 333, 0, n))
	if err != nil {
		return err
	}
	if err := verifyWrite(se, c, 4096, 333, n, 0x5C); err != nil {
		return err
	}
	if ch := se.dst.watch(0, se.size).until(s.guard); ch != nil {
		return fmt.Errorf("target memory changed after Succeeded: %v", ch)
	}
	return nil
}

// linkFaultCheck runs honest() under one link fault: the in-path proxy's
// on one host, the kernel's on the data link of two (faults.go).
func linkFaultCheck(kind string) func(context.Context, *suite, *Result) error {
	return func(ctx context.Context, s *suite, r *Result) error {
		if why := needsLinkFaults(s); why != "" {
			return errSkip("%s", why)
		}
		f, during, err := s.main.linkFault(kind)
		if err != nil {
			return err
		}
		return s.main.honest(ctx, r, f, honestyWin, during)
	}
}

// checkStallQuiesceNow: stall the link, post, and Quiesce at once without
// waiting for any completion. When Quiesce returns, nothing may land, even
// after the link comes back.
func checkStallQuiesceNow(ctx context.Context, s *suite, r *Result) error {
	if why := needsLinkFaults(s); why != "" {
		return errSkip("%s", why)
	}
	se := s.main
	const off, n = 64 << 10, honestyWin
	k, err := se.grant(ctx, off, n, 0xB3)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	if err := se.warm(ctx, k); err != nil {
		return err
	}
	se.fillDst(off, off+n, 0xB3)
	stall, _, err := se.linkFault("stall")
	if err != nil {
		return err
	}
	r.usedFault(stall.name)
	if err := stall.apply(); err != nil {
		return fmt.Errorf("fault %s not applied: %w", stall.name, err)
	}
	release := sync.OnceFunc(stall.release)
	defer release()
	b := se.split(k, 1234, 0, n, 64<<10)
	if err := se.ini.t.Post(ctx, b); err != nil {
		return fmt.Errorf("Post: %w", err)
	}
	q, err := se.quiesce(ctx, b.ID)
	w := se.dst.watch(0, se.size)
	if err != nil {
		// Honest, but only an answer to the stall if the write met it.
		r.Notes = append(r.Notes, fmt.Sprintf("Quiesce could not obtain evidence under a stall (%v)", err))
		return reachedWithin(stall, n, s.guard)
	}
	if e := quiesceCovers(q, b.ID); e != nil {
		return e
	}
	// The contract: batches pending when Quiesce succeeds are completed by
	// then (through gRPC the completion may trail the reply slightly).
	c, err := se.wait(b.ID, 2*time.Second)
	if err != nil {
		r.Promise = PromiseOneCompletion
		return fmt.Errorf("Quiesce returned, but the batch has no completion: %w", err)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("Quiesce: %s; batch %v", q.Evidence, c.Status))
	if c.Status == sdk.Succeeded {
		if err := mismatch(se.dstAt(off, off+n), se.src.Bytes()[1234:1234+n]); err != nil {
			r.Promise = PromiseSucceeded
			return fmt.Errorf("Succeeded on a stalled link without the bytes: %w", err)
		}
		if err := stall.carried(n); err != nil {
			return err
		}
	} else if err := stall.reachedBy(n); err != nil {
		return err
	}
	release()
	if ch := w.until(stall.watchAfter(s.guard)); ch != nil {
		return fmt.Errorf("Quiesce returned %s evidence, but bytes landed once the link came back: %v", q.Evidence, ch)
	}
	return nil
}

// checkNetem: delay and loss on the veth (netns only): statuses must stay
// honest and nothing may land after any promise.
func checkNetem(ctx context.Context, s *suite, r *Result) error {
	if s.shaper == nil {
		return errSkip("needs --netns or --netem-dev (tc netem on the data path)")
	}
	if s.shaper.err != nil {
		return errSkip("%s", netemMissing(s))
	}
	se := s.main
	for _, spec := range []string{"delay 20ms 5ms", "delay 5ms loss 10%", "loss 100%"} {
		if err := se.honest(ctx, r, s.shaper.fault(spec), 256<<10, nil); err != nil {
			return fmt.Errorf("netem %s: %w", spec, err)
		}
	}
	return nil
}

// netemMissing says exactly why the netem checks cannot run on a link
// whose kernel has no sch_netem, and what ran in their place: the veth's
// kernel faults cover stall, loss and reset, but none of them holds
// packets for a set time, so there is no honest delay to offer instead.
func netemMissing(s *suite) string {
	why := fmt.Sprintf("tc netem unavailable (%v)", s.shaper.err)
	if s.net == nil {
		return why
	}
	return why + "; the link checks ran with the veth's kernel faults instead (tbf, TCP blackhole, nftables reject, socket abort), " +
		"but this kernel has no qdisc that delays packets by a set time (netem) and nftables cannot delay, so fixed delay and jitter are not available"
}

// checkTargetStopped: SIGSTOP the target, post, judge the report, SIGCONT.
// A stopped target keeps bytes in its socket buffer and applies them when it
// resumes: a plugin that said FailedDefinite was lying.
func checkTargetStopped(ctx context.Context, s *suite, r *Result) error {
	return s.main.honest(ctx, r, stopFault(s.main.tgt), 256<<10, nil)
}

// checkDstDeregistered: deregister target memory while a slow batch is in
// flight; once DeregisterMemory returns, nothing may land in it.
func checkDstDeregistered(ctx context.Context, s *suite, r *Result) error {
	if err := notRevoking(s); err != nil {
		return err
	}
	se := s.main
	d := se.dst.Desc()
	const base, n = 1 << 20, 2 << 20
	d.Offset, d.Size = base, n
	id, err := se.tgt.t.RegisterMemory(ctx, d)
	if err != nil {
		return err
	}
	se.fillDst(base, base+n, 0x9D)
	k, err := se.tgt.g.Grant(ctx, sdk.Window{Region: id, Length: n})
	if err != nil {
		return err
	}
	if se.proxy != nil {
		se.proxy.SetDelay(time.Millisecond)
		defer se.proxy.SetDelay(0)
	}
	b := se.split(k, 0, 0, n, 32<<10)
	if err := se.ini.t.Post(ctx, b); err != nil {
		return err
	}
	time.Sleep(10 * time.Millisecond)
	if err := se.tgt.t.DeregisterMemory(ctx, id); err != nil {
		return fmt.Errorf("DeregisterMemory during a transfer: %w", err)
	}
	if ch := se.dst.watch(base, n).until(s.guard); ch != nil {
		return fmt.Errorf("bytes landed in deregistered memory after DeregisterMemory returned: %v", ch)
	}
	c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
	if err != nil {
		r.Promise = PromiseOneCompletion
		return err
	}
	r.Notes = append(r.Notes, fmt.Sprintf("batch %v (%s)", c.Status, c.Detail))
	if c.Status == sdk.Succeeded {
		if err := mismatch(se.dstAt(base, base+n), se.src.Bytes()[:n]); err != nil {
			r.Promise = PromiseSucceeded
			return fmt.Errorf("Succeeded although its memory was deregistered mid-transfer: %w", err)
		}
	}
	// A failure after the link was cut may leave the peer in need of a
	// Quiesce before it is used again; do it so later checks start clean.
	if c.Status == sdk.InDoubt {
		_, _ = se.quiesce(ctx, b.ID)
	}
	return nil
}

// checkTargetKilled: SIGKILL the target mid-stream (on a pair of its own).
// A batch the target never finished must not be Succeeded.
func checkTargetKilled(ctx context.Context, s *suite, r *Result) error {
	se, err := s.newSession(ctx, true)
	if err != nil {
		return err
	}
	defer se.close()
	const off, n = 4096, 4 << 20
	k, err := se.grant(ctx, off, n, 0x71)
	if err != nil {
		return err
	}
	if err := se.warm(ctx, k); err != nil {
		return err
	}
	se.fillDst(off, off+n, 0x71)
	if se.proxy != nil {
		se.proxy.SetDelay(time.Millisecond)
	}
	b := se.split(k, 0, 0, n, 64<<10)
	if err := se.ini.t.Post(ctx, b); err != nil {
		return err
	}
	time.Sleep(20 * time.Millisecond)
	if err := se.tgt.kill(10 * time.Second); err != nil {
		return err
	}
	c, err := se.wait(b.ID, s.cfg.CompletionTimeout)
	if err != nil {
		r.Promise = PromiseOneCompletion
		return err
	}
	r.Notes = append(r.Notes, fmt.Sprintf("batch %v (%s)", c.Status, c.Detail))
	if c.Status == sdk.Succeeded {
		if err := mismatch(se.dstAt(off, off+n), se.src.Bytes()[:n]); err != nil {
			return fmt.Errorf("reported Succeeded although the target died before applying it: %w", err)
		}
	}
	return nil
}
