package core

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
type deadlines[T timed] []T

// timed is an object with a place in a deadlines queue.
type timed interface {
	comparable
	timer() *timerSlot
}

// timerSlot is an object's place in a deadlines queue.
type timerSlot struct {
	due  Time // queued at this time (may be early)
	hpos int  // position + 1 in the queue; 0 when not queued
}

func (t *timerSlot) timer() *timerSlot { return t }

// schedule queues e at t, or moves its entry earlier to t.
func (q *deadlines[T]) schedule(x T, t Time) {
	e := x.timer()
	if e.hpos != 0 {
		if t < e.due {
			e.due = t
			q.up(e.hpos - 1)
		}
		return
	}
	e.due = t
	*q = append(*q, x)
	e.hpos = len(*q)
	q.up(len(*q) - 1)
}

// remove takes e out of the queue, if it is there.
func (q *deadlines[T]) remove(x T) {
	e := x.timer()
	if e.hpos == 0 {
		return
	}
	i, last := e.hpos-1, len(*q)-1
	q.swap(i, last)
	var zero T
	(*q)[last] = zero
	*q = (*q)[:last]
	e.hpos = 0
	if i < last {
		q.down(i)
		q.up(i)
	}
}

// popDue takes every exposure due at or before now out of the queue and
// appends it to into.
func (q *deadlines[T]) popDue(now Time, into []T) []T {
	for len(*q) > 0 && (*q)[0].timer().due <= now {
		x := (*q)[0]
		q.remove(x)
		into = append(into, x)
	}
	return into
}

func (q deadlines[T]) swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].timer().hpos, q[j].timer().hpos = i+1, j+1
}

func (q deadlines[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if q[p].timer().due <= q[i].timer().due {
			return
		}
		q.swap(i, p)
		i = p
	}
}

func (q deadlines[T]) down(i int) {
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
		q.swap(i, m)
		i = m
	}
}
