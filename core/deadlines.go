package core

import "time"

// deadlines is a timer queue of live objects (decode exposures, prefill
// streams and requests): a min-heap keyed by the earliest time a Tick may
// have to act on each, so that a Tick costs O(due · log live), not O(live).
// An object is in it at most once (its timerSlot says where) and leaves it
// when it is released, so the queue never holds more than the live set.
//
// A queued time may be early, never late: an input that can only move an
// object's next action later (a Grant, a resent Abort, a longer tail)
// leaves its entry alone, and the Tick that pops an early entry finds
// nothing to do and queues the object again at its real next time. An
// input that can make an action due sooner queues the object for the next
// Tick (schedule at now), so that Tick acts exactly as a full walk would.
//
// It is two heaps: entries due within span of the latest popDue's now
// (near) and the rest (far). Which one an entry is in never changes what
// popDue returns, only what an input costs: with 100,000 live objects whose
// timers wait far ahead (rank-lease-covered holds), a new near-term entry
// and its removal touch only the small near heap, not a path through a big
// heap of cold objects (docs/fence-cost.md).
type deadlines[T timed] struct {
	near, far tier[T]
	horizon   Time          // an entry due no later than this is queued near
	span      time.Duration // horizon is the latest popDue's now + span
}

// tier is one of the two heaps. Its objects' hpos is position + 1 in near
// and -(position + 1) in far.
type tier[T timed] struct {
	xs  []T
	neg bool // far: hpos is negative
}

// timed is an object with a place in a deadlines queue.
type timed interface {
	comparable
	timer() *timerSlot
}

// timerSlot is an object's place in a deadlines queue.
type timerSlot struct {
	due  Time // queued at this time (may be early)
	hpos int  // ± (position + 1) in the queue (tier); 0 when not queued
}

func (t *timerSlot) timer() *timerSlot { return t }

// widen makes entries up to twice d ahead of the latest Tick count as
// near from the next Tick on (the span only grows; twice: an input comes
// up to a Tick period after the Tick that set the horizon).
func (q *deadlines[T]) widen(d time.Duration) {
	if d > q.span/2 {
		q.span = max(2*d, d) // 2*d wraps negative past the largest duration
	}
}

// schedule queues e at t, or moves its entry earlier to t.
func (q *deadlines[T]) schedule(x T, t Time) {
	e := x.timer()
	if e.hpos != 0 {
		if t < e.due {
			e.due = t
			q.tierOf(e).up(e.index())
		}
		return
	}
	e.due = t
	q.far.neg = true
	h := &q.near
	if t > q.horizon {
		h = &q.far
	}
	h.xs = append(h.xs, x)
	i := len(h.xs) - 1
	h.place(i)
	h.up(i)
}

// remove takes e out of the queue, if it is there.
func (q *deadlines[T]) remove(x T) {
	e := x.timer()
	if e.hpos == 0 {
		return
	}
	q.tierOf(e).remove(e.index())
	e.hpos = 0
}

// popDue takes every object due at or before now out of the queue and
// appends it to into; near-term entries are near from here on.
func (q *deadlines[T]) popDue(now Time, into []T) []T {
	q.horizon = now.Add(q.span)
	for {
		h := &q.near
		if len(q.far.xs) > 0 && (len(h.xs) == 0 || q.far.xs[0].timer().due < h.xs[0].timer().due) {
			h = &q.far
		}
		if len(h.xs) == 0 || h.xs[0].timer().due > now {
			return into
		}
		x := h.xs[0]
		h.remove(0)
		x.timer().hpos = 0
		into = append(into, x)
	}
}

func (q *deadlines[T]) tierOf(e *timerSlot) *tier[T] {
	if e.hpos < 0 {
		return &q.far
	}
	return &q.near
}

// index is the slot's position in its tier.
func (t *timerSlot) index() int {
	if t.hpos < 0 {
		return -t.hpos - 1
	}
	return t.hpos - 1
}

// remove takes the entry at i out of the heap (its hpos is the caller's).
func (h *tier[T]) remove(i int) {
	last := len(h.xs) - 1
	h.swap(i, last)
	var zero T
	h.xs[last] = zero
	h.xs = h.xs[:last]
	if i < last {
		h.down(i)
		h.up(i)
	}
}

// place records in the object at i that it is there.
func (h *tier[T]) place(i int) {
	if h.neg {
		h.xs[i].timer().hpos = -(i + 1)
	} else {
		h.xs[i].timer().hpos = i + 1
	}
}

func (h *tier[T]) swap(i, j int) {
	h.xs[i], h.xs[j] = h.xs[j], h.xs[i]
	h.place(i)
	h.place(j)
}

func (h *tier[T]) up(i int) {
	q := h.xs
	for i > 0 {
		p := (i - 1) / 2
		if q[p].timer().due <= q[i].timer().due {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *tier[T]) down(i int) {
	q := h.xs
	for {
		l := 2*i + 1
		if l >= len(q) {
			return
		}
		m := l
		if r := l + 1; r < len(q) && q[r].timer().due < q[l].timer().due {
			m = r
		}
		if q[i].timer().due <= q[m].timer().due {
			return
		}
		h.swap(i, m)
		i = m
	}
}
