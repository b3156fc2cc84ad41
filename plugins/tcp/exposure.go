package tcp

import (
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// exposure is a granted window [off, off+length) of a region, under a key.
// Writes under the key apply only between begin and end; Revoke flips
// revoked and then waits until no write is between begin and end, cutting
// off any whose payload is still arriving after a grace by closing its
// connection.
type exposure struct {
	key    sdk.Key
	region *region
	off    uint64
	length uint64
	// stride, piece: a pieced window (pieces.go); zero stride: all of it.
	stride, piece uint64
	// writer, when set, is the presence of the one identity whose data
	// sessions may write under the key (sdk.Window.Writer); fixed at
	// Grant. The key dies with it (receiver.go: presence).
	writer *presence
	queued bool // under Transport.mu: on the list of revoked keys to forget

	mu       sync.Mutex
	idle     *sync.Cond // signalled when inflight drops
	revoked  bool
	inflight int
	active   map[*recvSession]int // sessions with a write in progress
	applied  uint64
	dropped  uint64
}

func newExposure(key sdk.Key, r *region, off, length uint64) *exposure {
	e := &exposure{key: key, region: r, off: off, length: length, active: map[*recvSession]int{}}
	e.idle = sync.NewCond(&e.mu)
	return e
}

// begin admits one write by s, or refuses it because the key is revoked.
// ignoreRevoke is the known-unsafe receiver variant.
func (e *exposure) begin(s *recvSession, ignoreRevoke bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.revoked && !ignoreRevoke {
		e.dropped++
		return false
	}
	e.inflight++
	e.active[s]++
	return true
}

// end closes a write admitted by begin.
func (e *exposure) end(s *recvSession, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.inflight--
	if e.active[s]--; e.active[s] == 0 {
		delete(e.active, s)
	}
	if ok {
		e.applied++
	}
	e.idle.Broadcast()
}

// revoke returns once no write under the key can still apply a byte.
func (e *exposure) revoke(grace time.Duration) sdk.RevokeResult {
	e.stop()
	return e.stopped(time.Now().Add(grace))
}

// stop refuses every later write under the key, without waiting for those
// in progress (RevokeMany stops all its keys first).
func (e *exposure) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.revoked = true
}

// cutOff ends the writes still in progress by closing their connections: a
// payload mid-read fails and its goroutine ends the write. The
// connection's other writes become InDoubt at the sender, so this waits
// for the grace: a healthy write finishes well within it.
func (e *exposure) cutOff() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for s := range e.active {
		s.abort()
	}
}

// stopped returns, after stop, once no write under the key is in progress;
// those still in progress at cutAt are cut off.
func (e *exposure) stopped(cutAt time.Time) sdk.RevokeResult {
	cut := time.AfterFunc(time.Until(cutAt), e.cutOff)
	defer cut.Stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.inflight > 0 {
		e.idle.Wait()
	}
	return sdk.RevokeResult{WritesApplied: e.applied, WritesDropped: e.dropped}
}
