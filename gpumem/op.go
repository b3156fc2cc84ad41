package gpumem

import (
	"sync"

	"github.com/kvfence/kvfence/errdefs"
)

// Piece is one contiguous range of device memory and the host bytes it is
// copied to (Gather) or from (Scatter); both have len(Host) bytes.
type Piece struct {
	Device uintptr
	Host   []byte
}

// Mover is what host-side gather/scatter code (an engine binding's staging)
// routes device buffers to. *Device implements it.
//
// Gather copies device → host, Scatter host → device; both return at once
// (no copy runs on the caller's thread) with an Op that completes later.
// Pieces whose device ranges follow each other are copied as one run.
type Mover interface {
	IsDevice(p uintptr) bool
	Gather(pieces []Piece) (*Op, error)
	Scatter(pieces []Piece) (*Op, error)
}

var _ Mover = (*Device)(nil)

// Op is one Gather or Scatter in progress.
//
// Cancel stops it: for a Gather no byte reaches the host pieces once Cancel
// returns (the host memory may be handed to someone else); for a Scatter
// the host pieces are not read once Cancel returns, but copies already
// given to the device still land in the device pieces until Done closes.
// Done closes when no copy of the Op can still run, cancelled or not.
type Op struct {
	done   chan struct{}
	mu     sync.Mutex // held while host bytes move, so Cancel waits for a copy in progress
	cancel bool
	err    error
	copies int
	left   int // batches not finished
	queued bool
}

func newOp() *Op { return &Op{done: make(chan struct{})} }

// Done is closed when the Op finished, failed or was cancelled, and nothing
// of it is in flight any more.
func (o *Op) Done() <-chan struct{} { return o.done }

// Ready reports whether Done is closed.
func (o *Op) Ready() bool {
	select {
	case <-o.done:
		return true
	default:
		return false
	}
}

// Wait blocks until Done and returns Err.
func (o *Op) Wait() error {
	<-o.done
	return o.Err()
}

// Err is why the Op failed (Unavailable when cancelled), nil when it
// completed or is still running.
func (o *Op) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// Copies is how many asynchronous copies the device was given so far.
func (o *Op) Copies() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.copies
}

// Cancel stops the Op (see Op). It does not wait for Done.
func (o *Op) Cancel() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.cancel {
		o.cancel = true
		if o.err == nil {
			o.err = errdefs.Errorf(errdefs.Unavailable, "copy cancelled")
		}
	}
}

func (o *Op) fail(err error) {
	o.mu.Lock()
	if o.err == nil {
		o.err = err
	}
	o.cancel = true
	o.mu.Unlock()
}

// batchDone counts one batch finished; the last (once all are queued)
// closes done.
func (o *Op) batchDone() {
	o.mu.Lock()
	o.left--
	end := o.queued && o.left == 0
	o.mu.Unlock()
	if end {
		close(o.done)
	}
}

// allQueued says no more batches come; closes done if none is pending.
func (o *Op) allQueued() {
	o.mu.Lock()
	o.queued = true
	end := o.left == 0
	o.mu.Unlock()
	if end {
		close(o.done)
	}
}

// Gather starts copying each piece's device range into its host bytes.
// Whether the ranges are device memory is asked of the driver off the
// caller's thread (once per run); a range that is not fails the Op with
// InvalidArgument before any copy.
func (d *Device) Gather(pieces []Piece) (*Op, error) { return d.start(pieces, false) }

// Scatter starts copying each piece's host bytes into its device range.
func (d *Device) Scatter(pieces []Piece) (*Op, error) { return d.start(pieces, true) }

func (d *Device) start(pieces []Piece, toDevice bool) (*Op, error) {
	for i, p := range pieces {
		if len(p.Host) == 0 || p.Device == 0 || p.Device+uintptr(len(p.Host)) < p.Device {
			return nil, errdefs.Errorf(errdefs.InvalidArgument, "piece %d: %d bytes at %#x", i, len(p.Host), p.Device)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errdefs.Errorf(errdefs.FailedPrecondition, "GPU device closed")
	}
	op := newOp()
	lane := d.lanes[0]
	if toDevice {
		lane = d.lanes[1]
	}
	lane.submit(op, append([]Piece(nil), pieces...))
	return op, nil
}
