package core

// timerHeap is a min-heap of (time, key) entries: the sender's timers
// (leases, bootstrap timeouts, tombstone expiry), so that a Tick looks only
// at what is due. Entries are values, not pointers: one whose key has gone,
// or whose time moved since, is checked against the current state when it
// comes out and dropped or queued again. A key may have more than one
// entry; every add of a timer pushes one.
type timerHeap[K comparable] []timerEntry[K]

type timerEntry[K comparable] struct {
	at  Time
	key K
}

func (h *timerHeap[K]) push(at Time, key K) {
	*h = append(*h, timerEntry[K]{at, key})
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if q[p].at <= q[i].at {
			break
		}
		q[p], q[i] = q[i], q[p]
		i = p
	}
}

// popDue removes and returns the earliest entry if it is due at now.
func (h *timerHeap[K]) popDue(now Time) (K, bool) {
	q := *h
	if len(q) == 0 || q[0].at > now {
		var zero K
		return zero, false
	}
	top := q[0].key
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(q) {
			break
		}
		m := l
		if r := l + 1; r < len(q) && q[r].at < q[l].at {
			m = r
		}
		if q[i].at <= q[m].at {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top, true
}
