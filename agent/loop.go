package agent

import (
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// errClosed answers calls on a closed agent.
var errClosed = errdefs.Errorf(errdefs.Unavailable, "agent closed")

// loop is the single goroutine that owns a core state machine. Every input
// is a closure run here, in arrival order, so the core never sees two inputs
// at once and its Output is acted on before the next input overwrites it.
type loop struct {
	deferred []func() // inputs the loop gives itself; never through the inbox, which could be full
	inbox    chan func()
	stop     chan struct{}
	done     chan struct{}
	// turnEnd, when set before run, runs at the end of a loop turn: once
	// the inbox is empty after an input, or after maxTurn inputs in a row
	// (so a busy loop still gets there). Decode revokes there, in one call,
	// the keys every input of the turn asked revoked.
	turnEnd func()
	inTurn  int
}

// maxTurn bounds a loop turn: a revocation waits for at most this many
// other inputs.
const maxTurn = 32

func newLoop() *loop {
	return &loop{inbox: make(chan func(), 1<<14), stop: make(chan struct{}), done: make(chan struct{})}
}

func (l *loop) run(tick time.Duration, onTick func()) {
	defer close(l.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case f := <-l.inbox:
			f()
		case <-t.C:
			onTick()
		case <-l.stop:
			return
		}
		for len(l.deferred) > 0 {
			f := l.deferred[0]
			l.deferred = l.deferred[1:]
			f()
		}
		l.endTurn()
	}
}

// endTurn runs turnEnd when the turn ended (see turnEnd).
func (l *loop) endTurn() {
	if l.turnEnd == nil {
		return
	}
	if l.inTurn++; len(l.inbox) == 0 || l.inTurn >= maxTurn {
		l.inTurn = 0
		l.turnEnd()
	}
}

// later queues an input from inside the loop: it runs after the current
// one, and never blocks (posting to a full inbox from the loop itself
// would deadlock it).
func (l *loop) later(f func()) { l.deferred = append(l.deferred, f) }

// post queues an input; it never blocks the caller for long (the inbox is
// large), and after shutdown the input is dropped.
func (l *loop) post(f func()) {
	select {
	case l.inbox <- f:
	case <-l.stop:
	}
}

// call runs f in the loop and waits for it.
func (l *loop) call(f func()) bool {
	ch := make(chan struct{})
	select {
	case l.inbox <- func() { f(); close(ch) }:
	case <-l.stop:
		return false
	}
	select {
	case <-ch:
		return true
	case <-l.done:
		return false
	}
}

// stopped is true once the loop stopped or is stopping (no call runs).
func (l *loop) stopped() bool {
	select {
	case <-l.stop:
		return true
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *loop) shutdown() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// now is the core's clock: wall-clock nanoseconds, because a lease is an
// absolute time on decode's clock that prefill compares with its own (one
// host here; across hosts the skew margins cover the difference).
func now() core.Time { return core.Time(time.Now().UnixNano()) }
