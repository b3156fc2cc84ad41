package verbs

// This file: the completion-polling loop, which harvests the CQ shared by
// every sender QP and turns completions into batch outcomes (tracker.go).

import (
	"fmt"
	"runtime"
	"time"
)

// Polling policy (Config.Poll). The loop polls the CQ until pollSpin polls
// in a row found nothing, then, by mode: event (default) arms the CQ's
// completion event, polls once more (a completion may have come first) and
// blocks on the completion channel (pollWaitMS at most, to see Close); nap
// sleeps 50 µs doubling to 1 ms between polls (Go rounds a sleep under 1 ms
// up to ~1 ms on Linux); spin keeps polling while any work request is
// outstanding (as perftest does) and waits for the next Post when none is.
// In every mode the loop yields (runtime.Gosched) after each harvest, so the
// goroutine waiting on Completions runs at once, and, with nothing in
// flight, waits for the next Post before it polls again.
const (
	pollSpin   = 64
	pollWaitMS = 10
)

// busy: some sender QP has work requests outstanding.
func (t *Transport) busy() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.byQPN {
		if c.ep.outstanding > 0 {
			return true
		}
	}
	return false
}

// waitForPost blocks until the next Post, pollWaitMS at most; false once
// the transport stops.
func (t *Transport) waitForPost(timer *time.Timer) bool {
	timer.Reset(pollWaitMS * time.Millisecond)
	select {
	case <-t.stop:
		timer.Stop()
		return false
	case <-t.wake:
		timer.Stop() // Go ≥ 1.23: no stale value after Stop
	case <-timer.C:
	}
	return true
}

// pollLoop harvests the CQ shared by every sender QP.
func (t *Transport) pollLoop() {
	defer close(t.pollDone)
	buf := make([]wc, 64)
	w := newPollWait()
	for {
		select {
		case <-t.stop:
			return
		default:
		}
		n, err := t.d.poll(buf)
		if err != nil {
			t.log.Error("poll CQ", "err", err)
		}
		if n == 0 {
			if !t.afterEmptyPoll(w) {
				return
			}
			continue
		}
		w.idle, w.nap = 0, napMin
		t.harvest(buf[:n])
		// Let the receiver of these completions run now, on this thread,
		// instead of after this loop's next polls (or on another CPU woken
		// up for it): measured in the TCG VM, this halved the one-batch
		// latency (BenchmarkDeviceBatchLatency p50 ~500 → ~200-260 µs).
		runtime.Gosched()
	}
}

// napMin is PollNap's first sleep; it doubles up to napMax.
const (
	napMin = 50 * time.Microsecond
	napMax = time.Millisecond
)

// pollWait is the loop's state between polls that found nothing.
type pollWait struct {
	idle  int           // empty polls in a row
	armed bool          // event: the CQ is armed
	nap   time.Duration // nap: the next sleep
	timer *time.Timer   // bounds the wait for a Post
}

func newPollWait() *pollWait {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	return &pollWait{nap: napMin, timer: timer}
}

// afterEmptyPoll waits as Config.Poll says after a poll found nothing;
// false once the transport stops.
func (t *Transport) afterEmptyPoll(w *pollWait) bool {
	if w.idle == 0 && t.cfg.Poll != PollSpin && !t.busy() {
		// Nothing in flight, so no completion can come before the
		// next Post: wait for it instead of polling alongside it
		// (on rxe the Post's own system call does the sending, and
		// polls spent meanwhile end the 64 before its completion
		// comes). pollWaitMS bounds the wait all the same.
		return t.waitForPost(w.timer)
	}
	if t.cfg.Poll == PollSpin {
		return t.spinOnce(w)
	}
	if w.idle++; w.idle < pollSpin {
		return true
	}
	if t.cfg.Poll == PollNap {
		time.Sleep(w.nap)
		if w.nap < napMax {
			w.nap *= 2
		}
		return true
	}
	t.awaitEvent(w)
	return true
}

// spinOnce: spin while work is outstanding (as perftest does); with none,
// wait for a Post. False once the transport stops.
func (t *Transport) spinOnce(w *pollWait) bool {
	if w.idle++; w.idle&63 != 0 {
		return true
	}
	runtime.Gosched()
	if t.busy() {
		return true
	}
	return t.waitForPost(w.timer)
}

// awaitEvent arms the CQ (the loop then polls once more: a completion may
// have come first) or, once armed, blocks on the completion channel for
// pollWaitMS at most.
func (t *Transport) awaitEvent(w *pollWait) {
	if !w.armed {
		if err := t.d.arm(); err != nil {
			t.log.Error("arm CQ", "err", err)
			time.Sleep(time.Millisecond)
			return
		}
		w.armed = true
		return
	}
	if _, err := t.d.wait(pollWaitMS); err != nil {
		t.log.Error("wait for a completion event", "err", err)
		time.Sleep(time.Millisecond)
	}
	w.armed = false // an event disarms the CQ; re-arming after a timeout is harmless
}

// harvest settles the batches these completions retire (tracker.go) and
// wakes the Quiesces waiting for a QP to drain.
func (t *Transport) harvest(wcs []wc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats["cqes"] += uint64(len(wcs))
	for _, w := range wcs {
		c, ok := t.byQPN[w.QPN]
		if !ok {
			continue
		}
		out, _ := c.ep.harvest(w.ID, w.Status)
		if w.Status != WCSuccess {
			t.stats["wc_"+fmt.Sprint(uint32(w.Status))]++
			c.broken = true // an error completion leaves an RC QP in ERROR
		}
		t.emitLocked(out...)
		if c.ep.drained() {
			t.changed.Broadcast()
		}
	}
}
