package conformance

import (
	"bytes"
	"fmt"
	"time"
)

// The sentinel watcher is how the suite sees bytes that land when they must
// not: it snapshots target memory at the moment a promise takes effect (a
// Succeeded, a FailedDefinite, a Quiesce or Revoke return, a reap) and then
// compares the memory to that snapshot every few milliseconds for the guard
// window. Target memory is the suite's own shared memory, so the watcher
// needs nothing from the plugin.

const watchEvery = 5 * time.Millisecond

// change is the first difference the watcher saw.
type change struct {
	After  time.Duration // since the watch began
	Offset int
	Was    byte
	Now    byte
}

func (c *change) String() string {
	return fmt.Sprintf("byte %d changed %#02x -> %#02x %v after", c.Offset, c.Was, c.Now, c.After.Round(time.Millisecond))
}

// watcher holds the snapshot taken when a promise took effect. Take it
// BEFORE releasing a fault: bytes released by the fault land within
// microseconds on loopback, and a snapshot taken after them would hide them.
type watcher struct {
	mem, snap []byte
	start     time.Time
}

func snapshot(mem []byte) *watcher {
	return &watcher{mem: mem, snap: append([]byte(nil), mem...), start: time.Now()}
}

// until reports the first change since the snapshot, watching until d after it.
func (w *watcher) until(d time.Duration) *change {
	for {
		if !bytes.Equal(w.snap, w.mem) {
			return firstDiff(w.snap, w.mem, time.Since(w.start))
		}
		if time.Since(w.start) >= d {
			return nil
		}
		time.Sleep(watchEvery)
	}
}

// watch snapshots mem now and reports the first change within d, or nil.
func watch(mem []byte, d time.Duration) *change { return snapshot(mem).until(d) }

// watchLast watches mem for d and reports the last change seen (nil if none):
// the crash check uses it to tell a tail that ended from one that did not.
func watchLast(mem []byte, d time.Duration) *change { return snapshot(mem).latest(d) }

func firstDiff(a, b []byte, after time.Duration) *change {
	for i := range a {
		if a[i] != b[i] {
			return &change{After: after, Offset: i, Was: a[i], Now: b[i]}
		}
	}
	return &change{After: after, Offset: -1}
}

// fill sets every byte of b to v.
func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// mismatch reports the first byte where got differs from want.
func mismatch(got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("byte %d of %d is %#02x, want %#02x", i, len(got), got[i], want[i])
		}
	}
	return fmt.Errorf("length %d, want %d", len(got), len(want))
}

// untouched reports the first byte of b that is not v.
func untouched(b []byte, v byte) error {
	for i, x := range b {
		if x != v {
			return fmt.Errorf("byte %d is %#02x, want sentinel %#02x", i, x, v)
		}
	}
	return nil
}
