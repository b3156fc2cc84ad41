package agent

import (
	"reflect"
	"sync"
	"testing"
)

// The coalescer runs one call at a time: items queued while a call runs go
// out together in the next one, each exactly once and in order, and the
// worker ends (its WaitGroup done) once the queue is empty.
func TestCoalescerBatchesWhileACallRuns(t *testing.T) {
	var wg sync.WaitGroup
	started, gate := make(chan struct{}), make(chan struct{})
	var batches [][]int
	c := &coalescer[int]{wg: &wg, run: func(b []int) {
		batches = append(batches, b)
		if len(batches) == 1 {
			close(started)
			<-gate // the first call is slow: the next items queue
		}
	}}
	c.add(1)
	<-started
	c.add(2)
	c.add(3)
	c.add(4)
	close(gate)
	wg.Wait()
	if want := [][]int{{1}, {2, 3, 4}}; !reflect.DeepEqual(batches, want) {
		t.Fatalf("batches %v, want %v", batches, want)
	}
	c.add(5) // a new worker after the last one ended
	wg.Wait()
	if len(batches) != 3 || !reflect.DeepEqual(batches[2], []int{5}) {
		t.Fatalf("after the worker ended: batches %v, want a third [5]", batches)
	}
}
