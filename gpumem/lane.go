package gpumem

import (
	"runtime"
	"sync"

	"github.com/kvfence/kvfence/errdefs"
)

// lane is one copy direction: a stream, its staging, a submitter goroutine
// that fills chunks and gives copies to the stream, and a completer that
// waits for each batch's event in stream order. A chunk goes back to the
// free list only after its event was seen complete: a chunk whose copy may
// still be in flight is never reused (it is leaked instead).
type lane struct {
	drv      *driver
	toDevice bool
	st       *staging
	str      stream
	jobs     chan job
	batches  chan *batch
	wg       sync.WaitGroup

	mu     sync.Mutex
	leaked int
	dead   chan struct{} // closed once every chunk is withheld
	chunks int
}

type job struct {
	op     *Op
	pieces []Piece
}

// segment is part of one piece placed in a chunk.
type segment struct {
	dev  uintptr
	host []byte
	off  int64 // in the chunk
}

type batch struct {
	op    *Op
	chunk int
	segs  []segment
	ev    event
	err   error // the event cannot be waited on: leak the chunk
}

func newLane(drv *driver, toDevice bool, chunkB int64, chunks int) (*lane, error) {
	st, err := newStaging(drv, chunkB, chunks)
	if err != nil {
		return nil, err
	}
	s, err := drv.newStream()
	if err != nil {
		return nil, err
	}
	l := &lane{drv: drv, toDevice: toDevice, st: st, str: s, jobs: make(chan job, 1024), batches: make(chan *batch, chunks),
		dead: make(chan struct{}), chunks: chunks}
	l.wg.Add(2)
	go l.submitter()
	go l.completer()
	return l, nil
}

func (l *lane) submit(op *Op, pieces []Piece) { l.jobs <- job{op, pieces} }

func (l *lane) close() {
	close(l.jobs)
	l.wg.Wait()
	_ = l.drv.destroyStream(l.str)
}

func (l *lane) leakedChunks() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaked
}

// withhold keeps a chunk whose copy may still be in flight out of use for
// ever; when none is left, ops fail instead of waiting.
func (l *lane) withhold() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaked++
	if l.leaked == l.chunks {
		close(l.dead)
	}
}

func (l *lane) submitter() {
	defer l.wg.Done()
	defer close(l.batches)
	for j := range l.jobs {
		l.run(j)
	}
}

// run cuts a job into chunk-sized batches and hands each to the stream.
func (l *lane) run(j job) {
	defer j.op.allQueued()
	if err := l.checkDevice(j.pieces); err != nil {
		j.op.fail(err)
		return
	}
	var segs []segment
	var used int64
	flush := func() bool {
		if len(segs) == 0 {
			return true
		}
		ok := l.issue(j.op, segs)
		segs, used = nil, 0
		return ok
	}
	for _, p := range j.pieces {
		for rest := p; len(rest.Host) > 0; {
			if used == l.st.chunkB && !flush() {
				return
			}
			n := min(int64(len(rest.Host)), l.st.chunkB-used)
			segs = append(segs, segment{dev: rest.Device, host: rest.Host[:n], off: used})
			used += n
			rest = Piece{Device: rest.Device + uintptr(n), Host: rest.Host[n:]}
		}
	}
	flush()
}

// checkDevice asks the driver whether each run of consecutive pieces
// starts and ends in device memory (a run that does lies in one mapping or
// in adjacent ones: the driver hands out no holes inside an allocation).
func (l *lane) checkDevice(pieces []Piece) error {
	for i := 0; i < len(pieces); {
		j, end := i, pieces[i].Device+uintptr(len(pieces[i].Host))
		for j+1 < len(pieces) && pieces[j+1].Device == end {
			j++
			end += uintptr(len(pieces[j].Host))
		}
		if !l.drv.isDevice(pieces[i].Device) || !l.drv.isDevice(end-1) {
			return errdefs.Errorf(errdefs.InvalidArgument, "pieces %d..%d: %#x..%#x is not device memory of %s", i, j, pieces[i].Device, end, l.drv.lib)
		}
		i = j + 1
	}
	return nil
}

// issue takes a free chunk (waiting for one: backpressure), fills it for a
// scatter, and enqueues one copy per run of consecutive device addresses.
// It reports false when the op is cancelled or failed.
func (l *lane) issue(op *Op, segs []segment) bool {
	var chunk int
	select {
	case chunk = <-l.st.free:
	case <-l.dead:
		op.fail(errdefs.Errorf(errdefs.Internal, "no staging left: every chunk is withheld after copies the device could not show finished"))
		return false
	}
	b := &batch{op: op, chunk: chunk, segs: segs}
	op.mu.Lock()
	if op.cancel {
		op.mu.Unlock()
		l.st.free <- chunk
		return false
	}
	if l.toDevice {
		c := l.st.chunk(chunk)
		parallelSegs(segs, func(s segment) { copy(c[s.off:], s.host) })
	}
	op.left++
	op.mu.Unlock()
	runs := l.runs(chunk, segs)
	ev, err := l.drv.newEvent()
	if err != nil {
		op.fail(err)
		l.st.free <- chunk // nothing was enqueued into it
		op.batchDone()
		return false
	}
	b.ev = ev
	n, err := l.drv.enqueue(l.str, ev, l.toDevice, runs)
	op.mu.Lock()
	op.copies += n
	op.mu.Unlock()
	if err != nil {
		op.fail(err)
	}
	l.batches <- b
	return err == nil
}

// runs merges segments whose device ranges follow each other (their chunk
// ranges always do) into one copy each.
func (l *lane) runs(chunk int, segs []segment) []copyRun {
	var out []copyRun
	for _, s := range segs {
		n := int64(len(s.host))
		if k := len(out) - 1; k >= 0 && out[k].dev+uintptr(out[k].n) == s.dev {
			out[k].n += n
			continue
		}
		out = append(out, copyRun{dev: s.dev, host: l.st.addr(chunk, s.off), n: n})
	}
	return out
}

// completer waits for each batch in stream order, moves a gather's bytes
// from the chunk to the host pieces (unless the op was cancelled), and
// gives the chunk back.
func (l *lane) completer() {
	defer l.wg.Done()
	for b := range l.batches {
		if err := l.drv.waitEvent(b.ev); err != nil {
			b.op.fail(err)
			l.withhold()
			b.op.batchDone()
			continue
		}
		l.drv.destroyEvent(b.ev)
		if !l.toDevice {
			b.op.mu.Lock()
			if !b.op.cancel {
				c := l.st.chunk(b.chunk)
				parallelSegs(b.segs, func(s segment) { copy(s.host, c[s.off:s.off+int64(len(s.host))]) })
			}
			b.op.mu.Unlock()
		}
		l.st.free <- b.chunk
		b.op.batchDone()
	}
}

// parallelSegs runs f on every segment, spread over a few goroutines when
// the batch is big: one core's memcpy is slower than a PCIe link, and the
// host copy is the staged mode's only cost over cuMemcpy.
func parallelSegs(segs []segment, f func(segment)) {
	var bytes int
	for _, s := range segs {
		bytes += len(s.host)
	}
	workers := min(runtime.GOMAXPROCS(0), 8, len(segs), bytes/(256<<10))
	if workers <= 1 {
		for _, s := range segs {
			f(s)
		}
		return
	}
	var wg sync.WaitGroup
	per := (len(segs) + workers - 1) / workers
	for lo := 0; lo < len(segs); lo += per {
		part := segs[lo:min(lo+per, len(segs))]
		wg.Go(func() {
			for _, s := range part {
				f(s)
			}
		})
	}
	wg.Wait()
}
