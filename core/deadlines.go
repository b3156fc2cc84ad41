package core

// deadlines is the receiver's timer queue: a min-heap of exposures keyed by
// the earliest time a Tick may have to act on each, so that a Tick costs
// O(due · log live), not O(live). An exposure is in it at most once
// (exposure.hpos is its position + 1; 0 when not queued).
//
// A queued time may be early, never late: an input that can only move an
// exposure's next action later (a Grant, a resent Abort, a longer tail)
// leaves its entry alone, and the Tick that pops an early entry finds
// nothing to do and queues the exposure again at its real next time. An
// input that can make an action due sooner queues the exposure for the next
// Tick (schedule at now), so that Tick acts exactly as a full walk would.
type deadlines []*exposure

// schedule queues e at t, or moves its entry earlier to t.
func (q *deadlines) schedule(e *exposure, t Time) {
	if e.hpos != 0 {
		if t < e.due {
			e.due = t
			q.up(e.hpos - 1)
		}
		return
	}
	e.due = t
	*q = append(*q, e)
	e.hpos = len(*q)
	q.up(len(*q) - 1)
}

// remove takes e out of the queue, if it is there.
func (q *deadlines) remove(e *exposure) {
	if e.hpos == 0 {
		return
	}
	i, last := e.hpos-1, len(*q)-1
	q.swap(i, last)
	(*q)[last] = nil
	*q = (*q)[:last]
	e.hpos = 0
	if i < last {
		q.down(i)
		q.up(i)
	}
}

// popDue takes every exposure due at or before now out of the queue and
// appends it to into.
func (q *deadlines) popDue(now Time, into []*exposure) []*exposure {
	for len(*q) > 0 && (*q)[0].due <= now {
		e := (*q)[0]
		q.remove(e)
		into = append(into, e)
	}
	return into
}

func (q deadlines) swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].hpos, q[j].hpos = i+1, j+1
}

func (q deadlines) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if q[p].due <= q[i].due {
			return
		}
		q.swap(i, p)
		i = p
	}
}

func (q deadlines) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(q) {
			return
		}
		m := l
		if r := l + 1; r < len(q) && q[r].due < q[l].due {
			m = r
		}
		if q[i].due <= q[m].due {
			return
		}
		q.swap(i, m)
		i = m
	}
}
