package nocancel

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// scripted is a Backend whose task states the test sets. It enforces the
// rule Mooncake enforces with BatchBusy: a job may be freed only after each
// of its tasks was polled in a terminal state; it counts violations instead
// of crashing.
type scripted struct {
	mu        sync.Mutex
	framing   string
	jobs      map[Job][]Task
	polledEnd map[Job][]bool
	next      Job
	busyOnce  bool
	freed     map[Job]bool
	early     int // Free calls before every task was polled terminal
	// gate, when set, holds Submit until it is closed (a library that
	// blocks in its submit call); refuse is then what Submit returns.
	gate   chan struct{}
	refuse error
	// openGate, when set, holds Open until it is closed.
	openGate chan struct{}
}

func newScripted(framing string) *scripted {
	return &scripted{framing: framing, jobs: map[Job][]Task{}, polledEnd: map[Job][]bool{}, freed: map[Job]bool{}}
}

func (s *scripted) Name() string                   { return "scripted" }
func (s *scripted) Version() string                { return "test" }
func (s *scripted) LocalName() string              { return "scripted-local" }
func (s *scripted) Register(uintptr, uint64) error { return nil }
func (s *scripted) Unregister(uintptr) error       { return nil }
func (s *scripted) Open(string, []byte) (Segment, error) {
	if s.openGate != nil {
		<-s.openGate
	}
	return 1, nil
}
func (s *scripted) Metadata() []byte       { return nil }
func (s *scripted) Framing() string        { return s.framing }
func (s *scripted) Confirms(f string) bool { return f == "v2" && s.framing == "v2" }

func (s *scripted) Submit(_ Segment, ws []Write) (Job, error) {
	if s.gate != nil {
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse != nil {
		return 0, s.refuse
	}
	s.next++
	s.jobs[s.next] = make([]Task, len(ws))
	s.polledEnd[s.next] = make([]bool, len(ws))
	return s.next, nil
}

func (s *scripted) Poll(j Job, i int) (Task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.jobs[j][i]
	if t.State.Terminal() {
		s.polledEnd[j][i] = true
	}
	return t, nil
}

func (s *scripted) Free(j Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.polledEnd[j] {
		if !p {
			s.early++
			return errdefs.Errorf(errdefs.Unavailable, "BatchBusy")
		}
	}
	if s.busyOnce {
		s.busyOnce = false
		return errdefs.Errorf(errdefs.Unavailable, "BatchBusy")
	}
	s.freed[j] = true
	return nil
}

func (s *scripted) set(j Job, i int, st TaskState) {
	s.mu.Lock()
	s.jobs[j][i].State = st
	s.mu.Unlock()
}

func (s *scripted) isFreed(j Job) bool { s.mu.Lock(); defer s.mu.Unlock(); return s.freed[j] }

func (s *scripted) hasJob(j Job) bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.jobs[j]) > 0 }

// pair is an initiator and a target over scripted backends, one source and
// one granted target window.
type pair struct {
	ini, tgt *Transport
	be       *scripted
	src      sdk.RegionID
	dst      sdk.RegionID
	key      sdk.Key
	peer     sdk.PeerID
}

func newPair(t *testing.T, framing string, reportAfter time.Duration) *pair {
	t.Helper()
	ctx := context.Background()
	p := &pair{be: newScripted(framing)}
	var err error
	mk := func(be Backend) *Transport {
		tr, err := New(Config{Backend: be, MaxTail: UnboundedTail, MaxBatch: 16, MaxOpBytes: 1 << 20, ReportAfter: reportAfter, PollEvery: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	p.ini, p.tgt = mk(p.be), mk(newScripted(framing))
	mem := func() sdk.MemoryDesc {
		m, err := sdk.NewSharedMemory("nocancel-test", 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m.Desc()
	}
	if p.src, err = p.ini.RegisterMemory(ctx, mem()); err != nil {
		t.Fatal(err)
	}
	if p.dst, err = p.tgt.RegisterMemory(ctx, mem()); err != nil {
		t.Fatal(err)
	}
	if p.key, err = p.tgt.Grant(ctx, sdk.Window{Region: p.dst, Length: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	ep, _ := p.tgt.LocalEndpoint(ctx)
	if p.peer, err = p.ini.Connect(ctx, ep); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pair) post(t *testing.T, id sdk.BatchID, ops int) Job {
	t.Helper()
	b := sdk.Batch{ID: id, Peer: p.peer}
	for i := 0; i < ops; i++ {
		b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: p.src, LocalOffset: uint64(i) * 4096, RemoteKey: p.key, RemoteOffset: uint64(i) * 4096, Length: 4096})
	}
	if err := p.ini.Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return p.be.next
}

func (p *pair) completion(t *testing.T, within time.Duration) (sdk.Completion, bool) {
	t.Helper()
	select {
	case c := <-p.ini.Completions():
		return c, true
	case <-time.After(within):
		return sdk.Completion{}, false
	}
}

// eventually waits for one event; the budget is generous (only a failing
// run pays it) because the poller that makes it happen is a goroutine a
// loaded 2-core machine may not run for seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("never: %s", what)
}

// FAILED, then the bytes land anyway (Mooncake over TCP with a stopped
// target): InDoubt, the source stays held for good, Quiesce has no evidence.
func TestFailedIsInDoubtAndHoldsTheSource(t *testing.T) {
	p := newPair(t, "v2", time.Hour)
	ctx := context.Background()
	j := p.post(t, 1, 2)
	p.be.set(j, 0, Failed)
	c, ok := p.completion(t, 5*time.Second)
	if !ok || c.Status != sdk.InDoubt {
		t.Fatalf("completion %+v ok=%v, want InDoubt", c, ok)
	}
	if p.be.isFreed(j) {
		t.Fatal("job freed while a task was still WAITING")
	}
	if err := p.ini.DeregisterMemory(ctx, p.src); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("source deregistered while a task still reads it: %v", err)
	}
	p.be.set(j, 1, Completed)
	eventually(t, "job freed once every task is terminal", func() bool { return p.be.isFreed(j) })
	if err := p.ini.DeregisterMemory(ctx, p.src); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("source released after a FAILED task (the backend may still read it): %v", err)
	}
	if _, err := p.ini.Quiesce(ctx, p.peer, []sdk.BatchID{1}); !errdefs.Is(err, errdefs.Unavailable) {
		t.Fatalf("Quiesce gave evidence for a FAILED batch: %v", err)
	}
	if _, ok := p.completion(t, 50*time.Millisecond); ok {
		t.Fatal("a second completion")
	}
	if p.be.early != 0 {
		t.Fatalf("%d Free calls before every task was polled terminal", p.be.early)
	}
}

// WAITING forever (Mooncake: large writes to a stopped target): one InDoubt
// at the report deadline, the job kept and polled, freed when it ends.
func TestWaitingForeverReportsOnceAndKeepsTheJob(t *testing.T) {
	p := newPair(t, "v2", 30*time.Millisecond)
	j := p.post(t, 7, 1)
	c, ok := p.completion(t, 5*time.Second)
	if !ok || c.Status != sdk.InDoubt {
		t.Fatalf("completion %+v ok=%v, want InDoubt at the deadline", c, ok)
	}
	time.Sleep(20 * time.Millisecond)
	if p.be.isFreed(j) {
		t.Fatal("job freed while WAITING")
	}
	p.be.set(j, 0, Completed)
	eventually(t, "job freed", func() bool { return p.be.isFreed(j) })
	if _, ok := p.completion(t, 50*time.Millisecond); ok {
		t.Fatal("a second completion after the late COMPLETED")
	}
}

// BatchBusy: Free refused once even after the end; the job is retried, and
// never freed before each task was polled terminal.
func TestBatchBusyRetried(t *testing.T) {
	p := newPair(t, "v2", time.Hour)
	p.be.busyOnce = true
	j := p.post(t, 9, 3)
	for i := 0; i < 3; i++ {
		p.be.set(j, i, Completed)
	}
	c, ok := p.completion(t, 5*time.Second)
	if !ok || c.Status != sdk.Succeeded || c.BytesLanded != 3*4096 {
		t.Fatalf("completion %+v ok=%v", c, ok)
	}
	eventually(t, "job freed after BatchBusy", func() bool { return p.be.isFreed(j) })
	if err := p.ini.DeregisterMemory(context.Background(), p.src); err != nil {
		t.Fatalf("source still held after a clean batch: %v", err)
	}
	q, err := p.ini.Quiesce(context.Background(), p.peer, []sdk.BatchID{9})
	if err != nil || q.Evidence != sdk.EvidenceCompletionsHarvested {
		t.Fatalf("Quiesce of a clean batch: %+v %v", q, err)
	}
	if p.be.early != 0 {
		t.Fatalf("%d early Free calls", p.be.early)
	}
}

// Legacy framing: COMPLETED before the target applied anything: InDoubt.
func TestLegacyFramingCompletedIsInDoubt(t *testing.T) {
	p := newPair(t, "legacy", time.Hour)
	j := p.post(t, 3, 1)
	p.be.set(j, 0, Completed)
	c, ok := p.completion(t, 5*time.Second)
	if !ok || c.Status != sdk.InDoubt {
		t.Fatalf("completion %+v ok=%v, want InDoubt", c, ok)
	}
}

// Deregistration is not revocation: target memory with keys is refused.
func TestTargetDeregisterWithKeysRefused(t *testing.T) {
	p := newPair(t, "v2", time.Hour)
	if err := p.tgt.DeregisterMemory(context.Background(), p.dst); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("DeregisterMemory with an unrevocable key: %v", err)
	}
	if _, err := p.tgt.Revoke(context.Background(), p.key); !errdefs.Is(err, errdefs.Unimplemented) {
		t.Fatalf("Revoke: %v", err)
	}
	if info, _ := p.tgt.Info(context.Background()); info.Capabilities.Revoke {
		t.Fatal("declares Revoke")
	}
}
