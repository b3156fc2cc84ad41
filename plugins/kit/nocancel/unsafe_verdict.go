//go:build kvfenceunsafe

package nocancel

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// unsafeVerdict is the deliberately broken failed-is-definite variant when
// env says so (tests only): a batch with a FAILED or TIMEOUT task is
// reported FailedDefinite, which is what a plugin that trusts the
// backend's error would do. The fault tests must catch it.
func unsafeVerdict(env string) func([]Task, bool, bool) (sdk.Completion, bool) {
	if env == "" || os.Getenv(env) != "failed-is-definite" {
		return nil
	}
	return func(tasks []Task, confirms, expired bool) (sdk.Completion, bool) {
		c, ok := Verdict(tasks, confirms, expired)
		for _, t := range tasks {
			if ok && (t.State == Failed || t.State == Timeout) {
				c.Status, c.Detail = sdk.FailedDefinite, "UNSAFE: FAILED taken as proof: "+c.Detail
				break
			}
		}
		return c, ok
	}
}

// unsafeLieAfter is the deliberately broken succeed-early-after:N variant
// when env says so (tests only): once this process has posted N batches,
// each further batch is reported Succeeded at once and handed to the
// backend only lieDelay later, so its bytes land after its Succeeded. A
// plugin that is honest for its first N batches and lies later is what a
// suite that reads target memory only in short-lived checks misses.
func unsafeLieAfter(env string) int {
	v, ok := strings.CutPrefix(os.Getenv(env), "succeed-early-after:")
	if env == "" || !ok {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0
	}
	return n
}

const lieDelay = 500 * time.Millisecond

// lieEarly reports bt Succeeded now and submits it lieDelay later; it
// returns false (the honest path) until the process posted LieAfter
// batches. Called with t.mu held.
func (t *Transport) lieEarly(bt *batch, ws []Write) bool {
	if t.cfg.lieAfter == 0 || t.stats["batches_posted"] < uint64(t.cfg.lieAfter) {
		return false
	}
	var n uint64
	for _, w := range ws {
		n += w.Length
	}
	bt.reported, bt.pending = true, true
	t.live[bt.id] = bt
	t.stats["batches_posted"]++
	t.stats["batches_lied_about"]++
	t.out <- sdk.Completion{Batch: bt.id, Status: sdk.Succeeded, BytesLanded: n}
	go func() {
		time.Sleep(lieDelay)
		t.mu.Lock()
		defer t.mu.Unlock()
		job, err := t.be.Submit(bt.peer.seg, ws)
		if err != nil {
			delete(t.live, bt.id)
			return
		}
		bt.job, bt.pending = job, false
		bt.posted = time.Now()
	}()
	return true
}
