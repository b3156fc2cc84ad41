package nocanceltest

import (
	"context"
	"fmt"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// Outcome is what one scenario saw: the completion, whether the bytes
// landed after the fault was lifted (late landing), and the promise broken
// (empty: none).
type Outcome struct {
	Completion sdk.Completion
	LateLanded bool
	Broken     string
	Detail     string
}

func (o Outcome) String() string {
	return fmt.Sprintf("%v (%s); late landing: %v; broken: %q %s", o.Completion.Status, o.Completion.Detail, o.LateLanded, o.Broken, o.Detail)
}

// StoppedTarget: SIGSTOP the target, post n bytes at off, judge what the
// plugin reports, SIGCONT, and watch target memory for guard:
//   - Succeeded while stopped: the bytes must already be there, and stay;
//   - FailedDefinite: nothing may land after SIGCONT;
//   - InDoubt: honest; Quiesce must then either refuse (no evidence) or
//     return evidence after which nothing lands.
func StoppedTarget(p *Pair, off, n, op uint64, wait, guard time.Duration) (Outcome, error) {
	ctx := context.Background()
	// Warm the key first (its first use asks the target's directory, which
	// a stopped target cannot answer), as the conformance suite does.
	warm := p.Write(off, 1, 1)
	if err := p.Ini.Transport().Post(ctx, warm); err != nil {
		return Outcome{}, fmt.Errorf("warm-up Post: %w", err)
	}
	if _, err := p.Wait(warm.ID, 10*time.Second); err != nil {
		return Outcome{}, fmt.Errorf("warm-up write: %w", err)
	}
	for i := range p.Dst.Bytes()[off : off+n] {
		p.Dst.Bytes()[off+uint64(i)] = 0xA7
	}
	p.Stop()
	stopped := true
	defer func() {
		if stopped {
			p.Cont()
		}
	}()
	b := p.Write(off, n, op)
	if err := p.Ini.Transport().Post(ctx, b); err != nil {
		return Outcome{}, fmt.Errorf("Post: %w", err)
	}
	c, err := p.Wait(b.ID, wait)
	if err != nil {
		return Outcome{Broken: PromiseOne, Detail: err.Error()}, nil
	}
	o := Outcome{Completion: c}
	switch c.Status {
	case sdk.Succeeded:
		if !p.Landed(off, n) {
			o.Broken, o.Detail = PromiseSucceeded, "Succeeded while the target was stopped, without the bytes"
		}
		w := p.Snapshot(off, n)
		p.Cont()
		stopped = false
		if p.ChangedSince(w, off, n, guard) {
			o.Broken, o.Detail = PromiseSucceeded, "target memory changed after Succeeded"
		}
	case sdk.FailedDefinite:
		w := p.Snapshot(off, n)
		p.Cont()
		stopped = false
		if p.ChangedSince(w, off, n, guard) {
			o.LateLanded = true
			o.Broken, o.Detail = PromiseFailed, "reported FailedDefinite, but bytes kept landing"
		}
	default:
		q, qerr := p.Ini.Transport().Quiesce(ctx, p.Peer, []sdk.BatchID{b.ID})
		w := p.Snapshot(off, n)
		p.Cont()
		stopped = false
		changed := p.ChangedSince(w, off, n, guard)
		o.LateLanded = changed || p.Landed(off, n)
		if qerr == nil {
			o.Detail = fmt.Sprintf("Quiesce: %s", q.Evidence)
			if changed {
				o.Broken, o.Detail = PromiseQuiesce, fmt.Sprintf("Quiesce returned %s, but bytes kept landing", q.Evidence)
			}
		} else {
			o.Detail = fmt.Sprintf("Quiesce without evidence (%v)", qerr)
		}
	}
	if o.Broken == "" {
		if err := p.NoMore(200 * time.Millisecond); err != nil {
			o.Broken, o.Detail = PromiseOne, err.Error()
		}
	}
	return o, nil
}
