package sim

import "container/heap"

// event is one thing that happens at a virtual time. seq breaks ties so the
// order is the same on every replay.
type event struct {
	at  int64
	seq uint64
	fn  func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type scheduler struct {
	q   eventQueue
	seq uint64
	now int64
}

func (s *scheduler) at(t int64, fn func()) {
	if t < s.now {
		t = s.now
	}
	s.seq++
	heap.Push(&s.q, &event{at: t, seq: s.seq, fn: fn})
}

func (s *scheduler) after(d int64, fn func()) { s.at(s.now+d, fn) }

func (s *scheduler) next() (func(), bool) {
	if len(s.q) == 0 {
		return nil, false
	}
	e := heap.Pop(&s.q).(*event)
	s.now = e.at
	return e.fn, true
}
