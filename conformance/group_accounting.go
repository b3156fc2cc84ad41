package conformance

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

func accountingGroup() group {
	return group{name: "completion-accounting", needs: needsGranter, checks: []check{
		{"concurrent-posters", PromiseOneCompletion, checkConcurrentPosters},
	}}
}

const (
	posters          = 16
	batchesPerPoster = 8
	slot             = 8 << 10
)

// checkConcurrentPosters: 16 goroutines post at once; every accepted batch
// gets exactly one completion (the host reports a second one as a protocol
// violation), none is lost, and each Succeeded batch's bytes are there.
func checkConcurrentPosters(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	const win = posters * batchesPerPoster * slot
	k, err := se.grant(ctx, 4096, win, 0x6B)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	violationsBefore := len(se.violations())
	var (
		mu   sync.Mutex
		ids  = map[sdk.BatchID]uint64{} // batch -> slot offset
		errs []error
		wg   sync.WaitGroup
	)
	for p := 0; p < posters; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < batchesPerPoster; j++ {
				off := uint64(p*batchesPerPoster+j) * slot
				b := se.split(k, off, off, slot, slot/2) // two ops per batch
				err := se.ini.t.Post(ctx, b)
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("poster %d: Post: %w", p, err))
				} else {
					ids[b.ID] = off
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	var lost []sdk.BatchID
	for id := range ids {
		if _, err := se.wait(id, s.cfg.CompletionTimeout); err != nil {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		return fmt.Errorf("%d of %d accepted batches never completed (e.g. batch %d within %v)", len(lost), len(ids), lost[0], s.cfg.CompletionTimeout)
	}
	// A duplicate shows by the time a later batch completes (one stream).
	if c, err := se.postWait(ctx, se.write(k, 0, 0, 1)); err != nil || c.Status != sdk.Succeeded {
		return healthy("final batch", c, err)
	}
	time.Sleep(100 * time.Millisecond)
	if v := se.violations(); len(v) > violationsBefore {
		return fmt.Errorf("the host saw %d protocol violations (a second completion, or one for an unknown batch): %s",
			len(v)-violationsBefore, v[violationsBefore].Detail)
	}
	ok := 0
	for id, off := range ids {
		if n := se.count(id); n != 1 {
			return fmt.Errorf("batch %d: %d completions, want exactly 1", id, n)
		}
		c, _ := se.wait(id, 0)
		if c.Status == sdk.Succeeded {
			ok++
			if err := mismatch(se.dstAt(4096+off, 4096+off+slot), se.src.Bytes()[off:off+slot]); err != nil {
				r.Promise = PromiseSucceeded
				return fmt.Errorf("batch %d Succeeded but its slot %w", id, err)
			}
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d posters x %d batches: %d completions, %d Succeeded", posters, batchesPerPoster, len(ids), ok))
	if ok != len(ids) {
		return fmt.Errorf("only %d of %d batches Succeeded on a healthy link", ok, len(ids))
	}
	return nil
}
