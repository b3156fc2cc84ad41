package conformance

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// honest is the two-host form of session.honest: a 1 MiB write into the
// sentinel-filled window while f holds, judged by what the target host
// observes in its memory. Succeeded: the bytes are there and nothing moves
// after; FailedDefinite: nothing moves once the fault is released; InDoubt:
// Quiesce's evidence, then nothing moves. Every outcome but Succeeded must
// have been reached by the fault (f.reached), Succeeded must have crossed
// it (f.carried): otherwise the check is NOT RUN, never a pass.
func (th *twoHost) honest(ctx context.Context, r *TwoHostCheck, f fault, during func()) error {
	se, n := th.se, uint64(twoHostWin)
	if c, err := se.postWait(ctx, se.write(th.key, 0, 0, 1)); err != nil || c.Status != sdk.Succeeded {
		return fmt.Errorf("warm-up write on a healthy link: %v %v", c.Status, err)
	}
	if _, err := th.cc.call(ctlRequest{Op: "fill", Off: twoHostOff, N: n, Byte: 0xA7}); err != nil {
		return err
	}
	released := false
	release := func() {
		if !released {
			released = true
			f.release()
		}
	}
	if err := f.apply(); err != nil {
		release()
		return fmt.Errorf("fault %s not applied: %w", f.name, err)
	}
	defer release()
	b := se.split(th.key, 999, 0, n, 64<<10)
	if err := se.t.Post(ctx, b); err != nil {
		id, serr := th.snap()
		release()
		if serr != nil {
			return serr
		}
		if ch, cerr := th.unchangedFor(id, f.watchAfter(th.guard)); cerr != nil || ch != "" {
			r.Promise = PromiseErrorClass
			return fmt.Errorf("Post refused (%v), yet target memory changed: %s%s", err, ch, errOrNil(cerr))
		}
		r.Notes = append(r.Notes, "Post refused under the fault: "+err.Error())
		return f.reachedBy(n)
	}
	if during != nil {
		during()
	}
	c, err := se.wait(b.ID, th.cfg.CompletionTimeout)
	if err != nil {
		r.Promise = PromiseOneCompletion
		return err
	}
	r.Notes = append(r.Notes, fmt.Sprintf("reported %v (%s)", c.Status, c.Detail))
	if err := th.judge(ctx, r, f, c, b.ID, release); err != nil {
		return err
	}
	if k := se.count(b.ID); k != 1 {
		r.Promise = PromiseOneCompletion
		return fmt.Errorf("batch %d: %d completions", b.ID, k)
	}
	return nil
}

// judge checks what the target host observed against the reported status.
func (th *twoHost) judge(ctx context.Context, r *TwoHostCheck, f fault, c sdk.Completion, id sdk.BatchID, release func()) error {
	n := uint64(twoHostWin)
	afterRelease := func(what string, promise string) error {
		snapID, err := th.snap()
		if err != nil {
			return err
		}
		release()
		if ch, err := th.unchangedFor(snapID, f.watchAfter(th.guard)); err != nil || ch != "" {
			r.Promise = promise
			return fmt.Errorf("%s, but target memory changed: %s%s", what, ch, errOrNil(err))
		}
		return nil
	}
	switch c.Status {
	case sdk.Succeeded:
		if bad, err := th.holds(twoHostOff, 999, n); err != nil || bad != "" {
			r.Promise = PromiseSucceeded
			return fmt.Errorf("reported Succeeded under the fault, but the target host does not hold the bytes: %s%s", bad, errOrNil(err))
		}
		if err := afterRelease("reported Succeeded", PromiseSucceeded); err != nil {
			return err
		}
		if f.carried != nil {
			return f.carried(n)
		}
		return nil
	case sdk.FailedDefinite:
		if err := afterRelease("reported FailedDefinite", PromiseFailed); err != nil {
			return err
		}
		return f.reachedBy(n)
	}
	if !f.underFault {
		release()
	}
	q, qerr := th.se.quiesce(ctx, id)
	if qerr != nil {
		release()
		r.Notes = append(r.Notes, fmt.Sprintf("Quiesce could not obtain evidence (%v): honest, the batch stays in doubt", qerr))
		return f.reachedBy(n)
	}
	if e := quiesceCovers(q, id); e != nil {
		r.Promise = PromiseQuiesce
		return e
	}
	r.Notes = append(r.Notes, "Quiesce: "+string(q.Evidence))
	if err := afterRelease(fmt.Sprintf("Quiesce returned %s evidence", q.Evidence), PromiseQuiesce); err != nil {
		return err
	}
	return f.reachedBy(n)
}

// close stops everything the run started, the namespaces last.
func (th *twoHost) close() {
	if th.se != nil {
		th.se.close()
	}
	th.hostPair.close()
}

// close says goodbye to the target host, waits for its process and removes
// the links and namespaces.
func (hp *hostPair) close() {
	if hp == nil {
		return
	}
	if hp.cc != nil {
		_, _ = hp.cc.call(ctlRequest{Op: "bye"})
		_ = hp.cc.c.Close()
	}
	if hp.target != nil && hp.target.Process != nil {
		done := make(chan struct{})
		go func() { _ = hp.target.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = hp.target.Process.Kill()
			<-done
		}
	}
	if hp.mgmt != "" {
		_ = runIP("link", "del", hp.mgmt)
	}
	if hp.net != nil {
		hp.net.close()
	}
}

func runIP(args ...string) error { return exec.Command("ip", args...).Run() }
