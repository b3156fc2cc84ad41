package gpumem

import (
	"sync"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// Buffer is one of the engine's KV buffers in GPU memory (a layer's K or
// V, ...): engine page p is PageBytes at Base + p*PageBytes. A kvfence page
// holds, for each buffer in order, that buffer's PageBytes of one engine
// page (the same layout SGLang's host-memory staging uses).
type Buffer struct {
	Base      uintptr
	PageBytes int64
}

// pieces lays the engine pages idx of every buffer against the kvfence
// pages (page(i) is kvfence page i), buffer-major so that consecutive
// engine pages of one buffer form one run.
func pieces(bufs []Buffer, idx []int, page func(int) []byte) ([]Piece, error) {
	var need int64
	for _, b := range bufs {
		if b.PageBytes <= 0 || b.Base == 0 {
			return nil, errdefs.Errorf(errdefs.InvalidArgument, "buffer %#x with %d-byte pages", b.Base, b.PageBytes)
		}
		need += b.PageBytes
	}
	var out []Piece
	var off int64
	for _, b := range bufs {
		for i, p := range idx {
			if p < 0 {
				return nil, errdefs.Errorf(errdefs.InvalidArgument, "engine page index %d", p)
			}
			pg := page(i)
			if int64(len(pg)) < need {
				return nil, errdefs.Errorf(errdefs.InvalidArgument, "a kvfence page of %d bytes cannot hold %d bytes of engine pages", len(pg), need)
			}
			out = append(out, Piece{Device: b.Base + uintptr(int64(p)*b.PageBytes), Host: pg[off : off+b.PageBytes]})
		}
		off += b.PageBytes
	}
	return out, nil
}

// StagedSender is prefill's staged mode in front of an agent KVSender:
// Send gathers the request's GPU pages into the sender's source pages
// (asynchronously) and marks them sendable once the copy completed.
type StagedSender struct {
	mv   Mover
	snd  *agent.KVSender
	bufs []Buffer

	mu      sync.Mutex
	op      *Op
	aborted bool
	err     error
}

// NewStagedSender stages snd's pages from the engine buffers bufs.
func NewStagedSender(mv Mover, snd *agent.KVSender, bufs []Buffer) *StagedSender {
	return &StagedSender{mv: mv, snd: snd, bufs: bufs}
}

// Send reserves len(idx) source pages, starts gathering the engine pages
// idx into them, and returns at once; the pages are sent (and the request
// finished) when the gather completes.
func (s *StagedSender) Send(idx []int) error {
	if err := s.snd.Init(len(idx)); err != nil {
		return err
	}
	ps, err := pieces(s.bufs, idx, s.snd.Page)
	if err != nil {
		s.snd.Abort()
		return err
	}
	op, err := s.mv.Gather(ps)
	if err != nil {
		s.snd.Abort()
		return err
	}
	s.mu.Lock()
	s.op = op
	s.mu.Unlock()
	go s.sendWhenGathered(op, len(idx))
	return nil
}

func (s *StagedSender) sendWhenGathered(op *Op, n int) {
	err := op.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		return
	}
	if err == nil {
		if err = s.snd.Send(n); err == nil {
			err = s.snd.Finish(n)
		}
	}
	if err != nil {
		s.err = err
		s.snd.Abort()
	}
}

// GPUReleasable reports whether the engine may give the request's GPU
// pages back: their device-to-host copy completed (or was stopped).
func (s *StagedSender) GPUReleasable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.op == nil || s.op.Ready()
}

// Poll is Transferring while the gather runs, then the sender's state.
func (s *StagedSender) Poll() agent.PollState {
	s.mu.Lock()
	op, err := s.op, s.err
	s.mu.Unlock()
	switch {
	case err != nil:
		return agent.PollFailed
	case op != nil && !op.Ready():
		return agent.PollTransferring
	}
	return s.snd.Poll()
}

// Err is why the request failed (the copy's error, else the sender's).
func (s *StagedSender) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	return s.snd.Err()
}

// Abort stops the gather (no byte reaches the source pages once it
// returns) and aborts the sender.
func (s *StagedSender) Abort() {
	s.mu.Lock()
	s.aborted = true
	if s.op != nil {
		s.op.Cancel()
	}
	s.mu.Unlock()
	s.snd.Abort()
}

// Close gives the sender back (SGLang's clear): its source pages return
// once no posted write can still read them.
func (s *StagedSender) Close() { s.snd.Close() }

// StagedReceiver is decode's staged mode in front of an agent KVReceiver:
// network writes land only in the receiver's slots (host memory the agent
// holds); once the request succeeded its pages are scattered into the
// engine's GPU pages, and Poll reports Transferring until that copy is done.
type StagedReceiver struct {
	mv   Mover
	rv   *agent.KVReceiver
	bufs []Buffer
	idx  []int

	quiet chan struct{} // closed when no copy into the GPU pages can run
	mu    sync.Mutex
	state agent.PollState
	op    *Op
	err   error
	abort bool
}

// NewStagedReceiver stages rv's pages into the engine buffers bufs.
func NewStagedReceiver(mv Mover, rv *agent.KVReceiver, bufs []Buffer) *StagedReceiver {
	return &StagedReceiver{mv: mv, rv: rv, bufs: bufs, quiet: make(chan struct{}), state: agent.PollBootstrapping}
}

// Init exposes len(idx) slots for the ranks and remembers the engine
// pages idx the request's KV goes to once it succeeded.
func (r *StagedReceiver) Init(idx []int, ranks []core.RankID) (core.Tag, error) {
	for _, p := range idx {
		if p < 0 {
			return core.Tag{}, errdefs.Errorf(errdefs.InvalidArgument, "engine page index %d", p)
		}
	}
	tag, err := r.rv.Init(len(idx), ranks)
	if err != nil {
		return tag, err
	}
	r.idx = append([]int(nil), idx...)
	startEarlyCopies(r)
	go r.scatterWhenHanded()
	return tag, nil
}

// scatterWhenHanded waits for the transfer to end; only a success is
// copied into GPU memory, and the slots go back once the copy read them.
func (r *StagedReceiver) scatterWhenHanded() {
	<-r.rv.Done()
	if r.rv.Poll() != agent.PollSuccess {
		r.settle(agent.PollFailed, r.rv.Err(), true)
		return
	}
	r.mu.Lock()
	if r.abort {
		r.mu.Unlock()
		r.rv.Finish()
		r.settle(agent.PollFailed, errdefs.Errorf(errdefs.Unavailable, "aborted"), true)
		return
	}
	pages := r.rv.Pages()
	ps, err := pieces(r.bufs, r.idx, func(i int) []byte { return pages[i] })
	var op *Op
	if err == nil {
		op, err = r.mv.Scatter(ps)
	}
	r.op = op
	r.mu.Unlock()
	if err == nil {
		err = op.Wait()
	}
	r.rv.Finish()
	if err != nil {
		r.settle(agent.PollFailed, err, true)
		return
	}
	r.settle(agent.PollSuccess, nil, true)
}

func (r *StagedReceiver) settle(st agent.PollState, err error, quiet bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state.Final() {
		return
	}
	r.state, r.err = st, err
	if quiet {
		close(r.quiet)
	}
}

// Poll is the receiver's state until the request succeeded, Transferring
// while the copy into GPU memory runs, then Success (or Failed).
func (r *StagedReceiver) Poll() agent.PollState {
	r.mu.Lock()
	st := r.state
	r.mu.Unlock()
	if st.Final() {
		return st
	}
	if s := r.rv.Poll(); s != agent.PollSuccess {
		return s
	}
	return agent.PollTransferring
}

// Err is why the request failed.
func (r *StagedReceiver) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Abort stops the request: before success the receiver is aborted (its
// slots stay held until safe, in host memory); during the copy into GPU
// memory the copy is cancelled. The engine may reuse the GPU pages once
// Quiesced is closed, not before.
func (r *StagedReceiver) Abort() {
	r.mu.Lock()
	r.abort = true
	op := r.op
	r.mu.Unlock()
	r.rv.Abort()
	if op != nil {
		op.Cancel() // scatterWhenHanded settles once the copy is over
		return
	}
	// No copy into GPU memory started, and none will (abort is set).
	r.settle(agent.PollFailed, errdefs.Errorf(errdefs.Unavailable, "aborted"), true)
}

// Quiesced is closed once no copy into the request's GPU pages can run.
func (r *StagedReceiver) Quiesced() <-chan struct{} { return r.quiet }
