package conformance

import (
	"sync"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// targetMem is the destination memory as the checks see it: the suite's
// own shared memory (one host), or memory the target host owns and reads,
// fills and watches on the suite's behalf over the control channel (two
// hosts). Checks never hold a slice of it: they ask for a copy, a fill or
// a watch of a range, so the same check runs on either.
//
// The memory operations do not return errors: on one host they cannot
// fail, and on two a failure is a broken control channel, not the
// plugin's doing. The first failure is kept and fails the check
// it happened in (runCheck), so a fill that never happened cannot pass for
// a sentinel that stayed. The suite keeps it (suite.memErr), so a failure
// in a session a check made for itself is not lost with the session.
type targetMem interface {
	Desc() sdk.MemoryDesc
	read(off, n uint64) []byte // a copy of [off,+n)
	fill(off, n uint64, v byte)
	pattern(off, n uint64, seed byte)
	watch(off, n uint64) memWatch // snapshot [off,+n) now
	Close() error
}

// memWatch is a snapshot taken when a promise took effect (watch.go).
type memWatch interface {
	until(d time.Duration) *change
	latest(d time.Duration) *change
}

// localMem is target memory in the certifying process.
type localMem struct{ *sdk.SharedMemory }

func (m localMem) read(off, n uint64) []byte  { return m.Bytes()[off : off+n] }
func (m localMem) fill(off, n uint64, v byte) { fill(m.Bytes()[off:off+n], v) }
func (m localMem) pattern(off, n uint64, seed byte) {
	patternAt(m.Bytes()[off:off+n], 0, seed)
}
func (m localMem) watch(off, n uint64) memWatch { return snapshot(m.Bytes()[off : off+n]) }

// patternAt is pattern for a range that starts at byte base of the
// patterned whole.
func patternAt(b []byte, base uint64, seed byte) {
	for j := range b {
		i := int(base) + j
		b[j] = byte(i*131+i>>9) ^ seed
	}
}

// stickyErr keeps the first error of a remote memory's operations.
type stickyErr struct {
	mu  sync.Mutex
	err error
}

func (s *stickyErr) set(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && err != nil {
		s.err = err
	}
}

// take returns the error kept since the last take, and forgets it.
func (s *stickyErr) take() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// targetMemory is the destination memory for a session whose target is tgt:
// on the target's host when it runs on another one.
func (s *suite) targetMemory(tgt *proc, size uint64) (targetMem, error) {
	if tgt.remote != nil {
		return tgt.remote.memory(size)
	}
	m, err := sdk.NewSharedMemory("conformance-dst", size)
	if err != nil {
		return nil, err
	}
	return localMem{m}, nil
}

// dstAt is a copy of [lo,hi) of the destination (local: the bytes themselves, read only).
func (se *session) dstAt(lo, hi uint64) []byte { return se.dst.read(lo, hi-lo) }

// fillDst sets [lo,hi) of the destination to v.
func (se *session) fillDst(lo, hi uint64, v byte) { se.dst.fill(lo, hi-lo, v) }
