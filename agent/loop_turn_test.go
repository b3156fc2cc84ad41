package agent

import (
	"testing"
	"time"
)

// A loop turn ends when the inbox empties, or after maxTurn inputs in a
// row: 70 inputs queued at once end three turns (after 32, 64 and 70), so
// decode revokes their fences in three calls, not 70, and a busy loop
// still revokes every maxTurn inputs.
func TestLoopTurnEndsWhenInboxEmpties(t *testing.T) {
	l := newLoop()
	turns := 0
	l.turnEnd = func() { turns++ }
	const n = 70
	done := make(chan struct{})
	for i := 0; i < n-1; i++ {
		l.post(func() {})
	}
	l.post(func() { close(done) })
	go l.run(time.Hour, func() {})
	defer l.shutdown()
	<-done
	got := -1
	l.call(func() { got = turns }) // after the 70th input's turn end
	if want := n/maxTurn + 1; got != want {
		t.Fatalf("%d inputs queued at once ended %d turns, want %d (maxTurn %d)", n, got, want, maxTurn)
	}
}
