package conformance

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

func crashGroup() group {
	return group{name: "crash", needs: needsGranter, checks: []check{
		{"initiator-killed-mid-stream", PromiseCrash, checkInitiatorKilled},
	}}
}

// streamThenKill streams op-byte writes under k into [0,n) and SIGKILLs
// the initiator while they flow; it returns the batches Post accepted.
func (se *session) streamThenKill(ctx context.Context, k sdk.Key, n, op uint64) ([]sdk.BatchID, error) {
	var (
		mu       sync.Mutex
		accepted []sdk.BatchID
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b := se.write(k, (i*op)%(n-op)+i%5, (i*op)%n, op)
			if err := se.ini.t.Post(ctx, b); err != nil {
				return // the plugin is gone
			}
			mu.Lock()
			accepted = append(accepted, b.ID)
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(150 * time.Millisecond)
	err := se.ini.kill(10 * time.Second)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return append([]sdk.BatchID(nil), accepted...), err
}

// checkInitiatorKilled: kill -9 of the initiator while it streams writes.
// Every batch it accepted gets exactly one completion (the host completes
// the outstanding ones InDoubt), the host reports process-exited evidence,
// Quiesce answers with it, and after the reap the target memory settles:
// bytes the dead process's kernel had already accepted may still arrive
// within MaxTail (noted), but none after.
func checkInitiatorKilled(ctx context.Context, s *suite, r *Result) error {
	se, err := s.newSession(ctx, true)
	if err != nil {
		return err
	}
	defer se.close()
	const off, n, op = 4096, 4 << 20, 256 << 10
	k, err := se.grant(ctx, off, n, 0x2C)
	if err != nil {
		return err
	}
	ids, err := se.streamThenKill(ctx, k, n, op)
	if err != nil {
		return err
	}
	ev, ok := se.eventOf(sdk.EventPluginExited, 10*time.Second)
	if !ok {
		return fmt.Errorf("no plugin-exited event after the reap")
	}
	if ev.Evidence != sdk.EvidenceProcessExited {
		return fmt.Errorf("plugin-exited evidence %q", ev.Evidence)
	}
	tail := s.watchedTail()
	last := se.dst.watch(0, se.size).latest(tail + s.guard)
	deadline := time.Now().Add(s.cfg.CompletionTimeout)
	for _, id := range ids {
		if _, err := se.wait(id, max(time.Until(deadline), 0)); err != nil {
			r.Promise = PromiseOneCompletion
			return fmt.Errorf("after the initiator died: %w", err)
		}
		if c := se.count(id); c != 1 {
			r.Promise = PromiseOneCompletion
			return fmt.Errorf("batch %d: %d completions", id, c)
		}
	}
	q, err := se.quiesce(ctx, ids...)
	if err != nil {
		return fmt.Errorf("Quiesce after the reap: %w", err)
	}
	if q.Evidence != sdk.EvidenceProcessExited {
		return fmt.Errorf("Quiesce after the reap: evidence %q, want process-exited", q.Evidence)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d batches accepted before kill -9; watched %v after the reap", len(ids), (tail+s.guard).Round(time.Millisecond)))
	if last != nil {
		if last.After > tail {
			return fmt.Errorf("target memory still changing %v after the reap (MaxTail %v): %v", last.After.Round(time.Millisecond), tail, last)
		}
		r.Notes = append(r.Notes, fmt.Sprintf("bytes landed up to %v after the reap (within MaxTail %v: data the dead process's kernel had already sent)",
			last.After.Round(time.Millisecond), tail))
	}
	return nil
}
