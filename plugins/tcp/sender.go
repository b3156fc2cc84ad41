package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// peer is a connected remote endpoint. Its current session is replaced
// after a Quiesce or a broken connection; old sessions stay reachable from
// their batches until quiesced.
type peer struct {
	id   sdk.PeerID
	addr string      // host:port
	pin  fingerprint // the receiver's certificate (identity.go)

	mu   sync.Mutex
	sess *sendSession
}

// batchState is the sender's bookkeeping for one accepted batch.
type batchState struct {
	id   sdk.BatchID
	sess *sendSession
	ops  []sdk.Op
	regs []*region // local source of each op, pinned until written or dropped

	// guarded by sess.mu
	unresolved int    // ops neither acknowledged nor refused
	landed     uint64 // bytes acknowledged as applied
	refused    ackCode
	refusedN   int  // ops resolved as not applied (refused, or never sent)
	pendingN   int  // ops written and awaiting acknowledgement
	completed  bool // the one completion was sent
	timer      *time.Timer

	// writing is set while the writer hands an op to the socket and still
	// pins its source; a definite completion that resolves meanwhile waits
	// in deferred until the writer lets go (see finishWrite).
	writing  bool
	deferred *deferredSettle
	// doubtDeferred is an InDoubt report (the connection broke) that
	// likewise waits for the writer to let go.
	doubtDeferred string
}

// deferredSettle is a settle that waits for the writer to unpin the source.
type deferredSettle struct {
	class  errdefs.Class
	detail string
}

// afterSocketWrite runs between a socket write and the unpinning of its
// source; tests widen that window with it.
var afterSocketWrite = func() {}

// markAckNow says whether a write asks for its acknowledgement at once
// (writeAckNow): when it ends its batch and nothing is queued behind it to
// carry the acknowledgements back with (acks.go). Tests replace it.
var markAckNow = func(lastOfBatch, queued bool) bool { return lastOfBatch && !queued }

// pendingOp is a written operation awaiting its acknowledgement.
type pendingOp struct {
	b   *batchState
	len uint64
}

// sendSession is one data connection to a receiver, with a writer goroutine
// (batches in order) and a reader goroutine (acknowledgements).
type sendSession struct {
	t    *Transport
	peer *peer
	// helloKey is the key of the batch that started the session: its HELLO
	// names it, and the receiver opens a session only for a key it granted
	// (admission.go).
	helloKey sdk.Key
	// held are batches taken off the queue while a refused HELLO was sorted
	// out (nextHelloKey); the writer sends them before the queue. Only the
	// writer goroutine touches it.
	held []*batchState
	// named are the keys the last HELLO named (nameHelloKeys).
	named []sdk.Key

	queue     chan *batchState
	stop      chan struct{} // closed to make the writer finish
	stopOnce  sync.Once
	writerEnd chan struct{} // closed when the writer drained its queue

	mu        sync.Mutex
	conn      net.Conn     // TLS; nil until dialled
	raw       net.Conn     // its TCP socket: what we close (sender_dial.go)
	cork      *corkedConn  // between the two: gathers records (cork.go)
	token     sessionToken // our session at the receiver (HELLO_ACK)
	seq       uint64
	pending   map[uint64]pendingOp
	batches   map[sdk.BatchID]*batchState // not fully resolved
	broken    error
	stopping  bool
	dialled   chan struct{} // closed when the dial attempt finished
	readerEnd chan struct{} // closed when the ack reader returned

	// How the connection ended as its reader and writer saw it (see
	// observe in closed.go; guarded by mu): peerClosed is the first sign
	// that the receiver closed it before we did (end of stream, or a
	// reset); localFault is the first failure that says our own side gave
	// up (a timeout, an unreachable host) — with one, an end of stream
	// proves nothing.
	peerClosed error
	localFault error
}

func newSendSession(t *Transport, p *peer, helloKey sdk.Key) *sendSession {
	s := &sendSession{
		t: t, peer: p, helloKey: helloKey,
		queue:     make(chan *batchState, t.cfg.QueueDepth),
		stop:      make(chan struct{}),
		writerEnd: make(chan struct{}),
		pending:   map[uint64]pendingOp{},
		batches:   map[sdk.BatchID]*batchState{},
		dialled:   make(chan struct{}),
		readerEnd: make(chan struct{}),
	}
	go s.run()
	return s
}

// run dials, then writes queued batches until stopped or broken.
func (s *sendSession) run() {
	defer close(s.writerEnd)
	// The dial ends as soon as the session is stopped (Close, Quiesce): a
	// receiver that accepts but never answers must not hold Close for the
	// dial's timeouts. Nothing is written before the dial returns.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, raw, ck, token, err := s.dialUsable(ctx)
	cancel()
	s.mu.Lock()
	if err == nil {
		s.conn, s.raw, s.cork, s.token = conn, raw, ck, token
	} else {
		s.broken = err
	}
	s.mu.Unlock()
	close(s.dialled)
	if err != nil {
		close(s.readerEnd)
		// Nothing ever left this process on this session: every batch on it
		// fails definitely (the receiver has no connection of ours).
		s.halt()
		class := errdefs.Unavailable
		if errors.Is(err, errHelloRefused) {
			class = classOfAck(ackRevoked) // the receiver's one answer
		}
		s.drainQueue(class, "dial failed: "+err.Error())
		return
	}
	go s.readAcks()
	for s.writeNext() {
	}
	// Stopped or broken: whatever is still queued was never sent.
	s.drainQueue(errdefs.Unavailable, "never sent: session ended")
}

func (s *sendSession) writeNext() bool {
	if len(s.held) > 0 {
		select {
		case <-s.stop:
			return false
		default:
		}
		b := s.held[0]
		s.held[0], s.held = nil, s.held[1:]
		return s.write(b)
	}
	select {
	case <-s.stop:
		return false
	case b := <-s.queue:
		return s.write(b)
	default:
	}
	// Nothing queued: what is gathered leaves before the writer waits.
	if err := s.cork.flush(); err != nil {
		s.mu.Lock()
		s.observe(err, false)
		s.mu.Unlock()
		s.fail(fmt.Errorf("write: %w", err))
		return false
	}
	select {
	case <-s.stop:
		return false
	case b := <-s.queue:
		return s.write(b)
	}
}

// halt stops the writer and makes Post pick a new session.
func (s *sendSession) halt() { s.stopOnce.Do(func() { close(s.stop) }) }

// usable reports whether Post may enqueue here. Caller holds s.mu.
func (s *sendSession) usable() bool { return s.broken == nil && !s.stopping }

// write sends one batch: a header and a payload per op, straight from the
// shared mapping (the TLS layer seals from it). While more batches are
// queued, the sealed records are gathered and leave in few large writes
// (cork.go); the writer flushes before it waits for the queue. The sources
// stay pinned until the batch is handed to the socket: the receiver's
// acknowledgement can arrive before that, and its completion then waits
// (finishWrite). It reports false if the session is over.
func (s *sendSession) write(b *batchState) bool {
	if s.t.cfg.unsafe == unsafeSucceedBeforeAck {
		// KNOWN-UNSAFE: reports Succeeded as soon as the batch is handed to
		// the socket writer — "the socket took it" is not "it landed".
		s.mu.Lock()
		if !b.completed {
			b.completed = true
			s.t.complete(sdk.Completion{Batch: b.id, Status: sdk.Succeeded, BytesLanded: batchBytes(b.ops)})
		}
		s.mu.Unlock()
	}
	s.cork.cork()
	var hb [headerSize]byte
	sent, goOn := 0, true // ops handed to the TLS layer; whether the session goes on
	var err error
	for i, op := range b.ops {
		s.mu.Lock()
		over := !s.usable()
		if over || b.completed && s.t.cfg.unsafe != unsafeSucceedBeforeAck {
			// A batch already reported InDoubt (timeout) is not sent further:
			// that only shortens its tail.
			b.writing = true // the resolution below waits for finishWrite
			s.unpinFrom(b, i)
			s.resolveUnsent(b, len(b.ops)-i, "not sent")
			s.mu.Unlock()
			goOn = !over
			break
		}
		s.seq++
		seq := s.seq
		s.pending[seq] = pendingOp{b: b, len: op.Length}
		b.pendingN++
		b.writing = true
		conn := s.conn
		s.mu.Unlock()

		h := header{Type: frameWrite, Seq: seq, Key: uint64(op.RemoteKey), Offset: op.RemoteOffset,
			Length: op.Length, Deadline: time.Now().Add(s.t.cfg.WriteTTL).UnixNano()}
		if markAckNow(i == len(b.ops)-1, s.queued() > 0) {
			h.Code = writeAckNow
		}
		h.encode(hb[:])
		src := b.regs[i].mem[op.LocalOffset : op.LocalOffset+op.Length]
		sent = i + 1
		if _, err = conn.Write(hb[:]); err == nil {
			_, err = conn.Write(src)
		}
		if err != nil {
			break
		}
	}
	if err == nil && goOn && s.queued() == 0 {
		err = s.cork.flush()
	}
	if err != nil {
		s.mu.Lock()
		s.observe(err, false)
		s.unpinFrom(b, sent)
		s.resolveUnsent(b, len(b.ops)-sent, "not sent: connection lost")
		s.mu.Unlock()
	}
	afterSocketWrite()
	s.finishWrite(b, sent)
	if err != nil {
		s.fail(fmt.Errorf("write: %w", err))
		return false
	}
	return goOn
}

func batchBytes(ops []sdk.Op) uint64 {
	var n uint64
	for _, op := range ops {
		n += op.Length
	}
	return n
}

// finishWrite unpins the sources of ops [0:sent] after their socket
// writes, then delivers a completion that resolved while the writes were in
// progress: an acknowledgement can arrive before the writer lets go, and
// reporting the batch then would let the engine deregister a region still
// pinned here.
func (s *sendSession) finishWrite(b *batchState, sent int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range b.regs[:sent] {
		r.release()
	}
	b.writing = false
	if why := b.doubtDeferred; why != "" && !b.completed {
		b.completed = true
		s.t.complete(sdk.Completion{Batch: b.id, Status: sdk.InDoubt, BytesLanded: b.landed, Class: errdefs.Unavailable, Detail: why})
	}
	if d := b.deferred; d != nil {
		b.deferred = nil
		s.settle(b, d.class, d.detail)
	}
}

// unpinFrom releases the source regions of ops [i:] that will not be sent.
// Caller holds s.mu (region locks are independent).
func (s *sendSession) unpinFrom(b *batchState, i int) {
	for ; i < len(b.ops); i++ {
		b.regs[i].release()
	}
}

// resolveUnsent counts n ops of b as provably not applied (never sent).
// Caller holds s.mu.
func (s *sendSession) resolveUnsent(b *batchState, n int, why string) {
	s.resolveUnsentClass(b, n, errdefs.Unavailable, why)
}

func (s *sendSession) resolveUnsentClass(b *batchState, n int, class errdefs.Class, why string) {
	if n <= 0 {
		return
	}
	b.unresolved -= n
	b.refusedN += n
	s.settle(b, class, why)
}

// queued counts the batches waiting for the writer.
func (s *sendSession) queued() int { return len(s.queue) + len(s.held) }

// drainQueue resolves every queued batch as never sent.
func (s *sendSession) drainQueue(class errdefs.Class, why string) {
	held := s.held
	s.held = nil
	for _, b := range held {
		s.mu.Lock()
		s.unpinFrom(b, 0)
		s.resolveUnsentClass(b, len(b.ops), class, why)
		s.mu.Unlock()
	}
	for {
		select {
		case b := <-s.queue:
			s.mu.Lock()
			s.unpinFrom(b, 0)
			s.resolveUnsentClass(b, len(b.ops), class, why)
			s.mu.Unlock()
		default:
			return
		}
	}
}

// readAcks turns acknowledgements into completions until the connection ends.
func (s *sendSession) readAcks() {
	defer close(s.readerEnd)
	var hb [headerSize]byte
	for {
		if _, err := io.ReadFull(s.conn, hb[:]); err != nil {
			s.mu.Lock()
			s.observe(err, true)
			s.mu.Unlock()
			s.fail(fmt.Errorf("read: %w", err))
			return
		}
		h, err := decodeHeader(hb[:], 0)
		if err != nil || h.Type != frameAck {
			s.t.stats.add(statGarbage, 1)
			s.fail(fmt.Errorf("garbage from receiver: %v", err))
			return
		}
		s.mu.Lock()
		p, ok := s.pending[h.Seq]
		if !ok {
			s.mu.Unlock()
			s.t.stats.add(statGarbage, 1)
			continue
		}
		delete(s.pending, h.Seq)
		p.b.pendingN--
		p.b.unresolved--
		if ackCode(h.Code) == ackOK {
			p.b.landed += p.len
		} else {
			p.b.refusedN++
			p.b.refused = ackCode(h.Code)
		}
		s.settle(p.b, classOfAck(ackCode(h.Code)), ackDetail(ackCode(h.Code)))
		s.mu.Unlock()
	}
}

// settle completes b once every op is resolved: Succeeded if every op was
// acknowledged, else FailedDefinite (every unacknowledged op was refused by
// the receiver or never sent: none of it can apply). Caller holds s.mu.
func (s *sendSession) settle(b *batchState, class errdefs.Class, detail string) {
	if b.unresolved > 0 {
		return
	}
	if b.writing {
		b.deferred = &deferredSettle{class: class, detail: detail}
		return
	}
	delete(s.batches, b.id)
	s.t.batchMu.Lock()
	delete(s.t.batches, b.id)
	s.t.batchMu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.completed {
		return
	}
	b.completed = true
	if b.refusedN == 0 {
		s.t.complete(sdk.Completion{Batch: b.id, Status: sdk.Succeeded, BytesLanded: b.landed})
		return
	}
	s.t.complete(sdk.Completion{Batch: b.id, Status: sdk.FailedDefinite, BytesLanded: b.landed, Class: class, Detail: detail})
}

// timeout reports b InDoubt if it is not resolved in time. Its ops stay
// tracked: a later acknowledgement still resolves them for Quiesce.
func (s *sendSession) timeout(b *batchState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.completed {
		return
	}
	b.completed = true
	status := sdk.InDoubt
	if s.t.cfg.unsafe == unsafeFailedOnTimeout {
		status = sdk.FailedDefinite // KNOWN-UNSAFE: a timeout proves nothing
	}
	s.t.complete(sdk.Completion{Batch: b.id, Status: status, BytesLanded: b.landed, Class: errdefs.Unavailable,
		Detail: "no acknowledgement within the ack timeout"})
}

// fail marks the session broken: every batch with a write still awaiting
// its acknowledgement is InDoubt — those bytes may sit in the receiver's
// socket buffer and still be applied until their deadline or a Quiesce.
func (s *sendSession) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken == nil {
		s.broken = err
	}
	if s.raw != nil {
		_ = s.raw.Close()
	}
	s.halt()
	if s.stopping {
		// A Quiesce is in progress: it settles these batches on the
		// receiver's confirmation (or its close of the connection), or
		// reports them InDoubt if it gets neither.
		return
	}
	s.doubtWritten(err)
}

// doubtWritten completes InDoubt every batch with a write awaiting its
// acknowledgement (one the writer still pins, once it lets go). Caller
// holds s.mu.
func (s *sendSession) doubtWritten(err error) {
	for _, b := range s.batches {
		if !b.completed && b.pendingN > 0 && b.writing {
			b.doubtDeferred = "connection lost: " + err.Error()
			continue
		}
		if !b.completed && b.pendingN > 0 {
			b.completed = true
			s.t.complete(sdk.Completion{Batch: b.id, Status: sdk.InDoubt, BytesLanded: b.landed, Class: errdefs.Unavailable,
				Detail: "connection lost: " + err.Error()})
		}
	}
}

// quiesce ends the session and returns once nothing written on it can
// still be applied, with the evidence: receiver-confirmed when the receiver
// answered that it ended our session there, receiver-closed when it cannot
// answer (gone, unreachable, or another incarnation on its address) but had
// closed our data connection first (see receiverClosed). Without either it
// returns an error and every written batch stays in doubt. Every batch of
// the session is completed when it returns nil.
func (s *sendSession) quiesce(ctx context.Context) (sdk.Evidence, error) {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.halt()
	select {
	case <-s.dialled:
	case <-ctx.Done():
		return "", errdefs.Errorf(errdefs.Unavailable, "Quiesce: dial still in progress: %v", ctx.Err())
	}
	s.mu.Lock()
	conn, token := s.conn, s.token
	s.mu.Unlock()
	ev := sdk.EvidenceReceiverConfirmed
	if conn != nil {
		var err error
		if s.t.cfg.unsafe == unsafeOwnCloseIsReceiverClosed {
			// KNOWN-UNSAFE: the sender closes its own side and takes the
			// end of its reader for the receiver's close, while the
			// receiver may still be reading what sits in its socket buffer.
			err = errdefs.Errorf(errdefs.Unavailable, "Quiesce: not asking the receiver")
			s.fail(fmt.Errorf("closed by the sender to quiesce"))
		} else {
			err = s.askReceiver(ctx, token)
		}
		if err != nil {
			if !s.receiverClosed(ctx) {
				s.mu.Lock()
				s.doubtWritten(err)
				s.mu.Unlock()
				return "", err
			}
			ev = sdk.EvidenceReceiverClosed
		} else {
			// The receiver closed its side; drain the acknowledgements it
			// sent before that, briefly, then cut our side.
			select {
			case <-s.readerEnd:
			case <-time.After(2 * time.Second):
			}
		}
		s.fail(fmt.Errorf("quiesced"))
		<-s.readerEnd
	}
	<-s.writerEnd
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq, p := range s.pending {
		delete(s.pending, seq)
		p.b.pendingN--
		p.b.unresolved--
		p.b.refusedN++
	}
	why := "quiesced: receiver confirmed it applies nothing more"
	if ev == sdk.EvidenceReceiverClosed {
		why = "quiesced: the receiver closed the connection; it applies nothing more of it"
	}
	for _, b := range s.batches {
		s.settle(b, errdefs.Unavailable, why)
	}
	return ev, nil
}

func classOfAck(c ackCode) errdefs.Class {
	switch c {
	case ackUnknownKey:
		return errdefs.NotFound
	case ackRevoked, ackExpired, ackNotWriter:
		return errdefs.FailedPrecondition
	case ackOutOfBounds:
		return errdefs.InvalidArgument
	}
	return errdefs.Unknown
}

func ackDetail(c ackCode) string {
	switch c {
	case ackUnknownKey:
		return "receiver: unknown key"
	case ackRevoked:
		return "receiver: key revoked"
	case ackOutOfBounds:
		return "receiver: write outside the granted window"
	case ackExpired:
		return "receiver: write arrived past its deadline"
	case ackNotWriter:
		return "receiver: the key is bound to another writer"
	}
	return ""
}
