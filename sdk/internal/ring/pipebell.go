package ring

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A pipe doorbell (layout v2, negotiated) replaces the futex: the consumer
// waits by reading a pipe, so its goroutine parks in Go's netpoller and
// holds no thread. A futex wait is a blocking syscall: the thread stays in
// the kernel with its P, the runtime's monitor retakes the P after 20 µs
// and hands it to another thread, and the woken thread has to find a P
// again — thread wake-ups that the other process pays for on a quiet
// machine (measured: docs/boundary.md). The producer writes one byte per
// sleep of the consumer (Doorbell's compare-and-swap still decides who
// rings), with a raw non-blocking write that never waits: a full pipe
// means a wake-up is pending anyway.
type pipeBell struct {
	wait *os.File        // the consumer reads it (nil on a producer-only view)
	ring syscall.RawConn // written to wake the consumer (the same pipe)
	buf  [64]byte
}

// UsePipe makes this view's doorbell a pipe: wait is the pollable
// (non-blocking) read side the consumer sleeps on, nil on the producer's
// view; ring is the pipe written to wake it (the producer's Doorbell, or
// the consumer's own Interrupt). Both views of a ring must agree: that is
// the negotiation's job. The files stay the caller's to close, after the
// ring is no longer used.
func (r *Ring) UsePipe(wait, ring *os.File) error {
	rc, err := ring.SyscallConn()
	if err != nil {
		return err
	}
	r.pipe = &pipeBell{wait: wait, ring: rc}
	return nil
}

// Piped says whether this view's doorbell is a pipe (v2) or the futex.
func (r *Ring) Piped() bool { return r.pipe != nil }

// ringPipe writes one wake-up byte without ever blocking.
func (b *pipeBell) ringPipe() {
	one := [1]byte{1}
	_ = b.ring.Write(func(fd uintptr) bool {
		_, _ = unix.Write(int(fd), one[:])
		return true // never wait for room: a full pipe already wakes
	})
}

// sleep waits for a byte (or d), parked in the netpoller; the bytes read
// are wake-ups, and one left over from an earlier sleep only costs one
// spurious return (callers re-check the ring).
func (b *pipeBell) sleep(d time.Duration) {
	if b.wait == nil {
		time.Sleep(d) // a producer-only view has no bell to wait on
		return
	}
	_ = b.wait.SetReadDeadline(time.Now().Add(d))
	if _, err := b.wait.Read(b.buf[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		time.Sleep(time.Millisecond) // a broken pipe must not become a busy loop
	}
}

// Pipe is a fresh non-blocking, close-on-exec pipe as two files the
// runtime polls, for the host to offer as a doorbell, and the path by
// which another process opens it (OpenPipe).
func Pipe() (rd, wr *os.File, path string, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, nil, "", err
	}
	path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), p[0])
	return os.NewFile(uintptr(p[0]), "ring-bell-r"), os.NewFile(uintptr(p[1]), "ring-bell-w"), path, nil
}

// OpenPipe opens a doorbell pipe the host offered (by its /proc path)
// for reading and writing, non-blocking, so the runtime polls it. A path
// that is not a pipe is refused: a file that reads at once (a device, a
// regular file) would turn every sleep into a busy loop.
func OpenPipe(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		_ = f.Close()
		return nil, fmt.Errorf("%s is not a pipe", path)
	}
	return f, nil
}
