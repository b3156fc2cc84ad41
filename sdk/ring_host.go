package sdk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk/internal/ring"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/grpc"
)

// envRings lets an operator (or a benchmark's baseline arm) turn the rings
// off on the host: "off" makes every Post a gRPC call, as with a plugin
// that predates them.
const envRings = "KVFENCE_RINGS"

// envAsyncPost lets an operator choose the Post contract for every
// plugin a host opens, without a flag in each host's code: "off" asks for
// the synchronous Post (as OpenOptions.SyncPost does), "on" for the
// asynchronous one even where the host asked for SyncPost; unset leaves
// the host's choice (asynchronous by default). The agent, the demo's ranks
// and libkvfence all open plugins through Open, so all honour it.
const envAsyncPost = "KVFENCE_ASYNC_POST"

// AsyncPostFromEnv is the host's choice (async: true unless it asked for
// OpenOptions.SyncPost) as KVFENCE_ASYNC_POST amends it; any other value
// than on/off is refused, so a typo does not silently pick a contract.
func AsyncPostFromEnv(async bool) (bool, error) {
	switch v := os.Getenv(envAsyncPost); v {
	case "":
		return async, nil
	case "on":
		return true, nil
	case "off":
		return false, nil
	default:
		return false, fmt.Errorf("%s=%q: want on or off", envAsyncPost, v)
	}
}

// ringsAttachMethod is the negotiation: a plugin whose SDK knows the rings
// serves it; an older one answers Unimplemented and the host keeps Post on
// gRPC. It reuses the Endpoint message, so the protocol file is unchanged:
// Transport names the data path and its version, Address the memfd path
// to map, Opaque the ring capacity (8 bytes, little endian) and, from v2
// on, the doorbell pipes' paths after it (submissions', then
// completions', separated by a newline). The host offers v2 first; a
// plugin that knows only v1 refuses it as InvalidArgument (it checks the
// transport name and the 8 bytes), and the host offers v1 again.
const (
	ringsAttachMethod = "/kvfence.transport.v1.Rings/Attach"
	ringsDataPath     = "kvfence-rings/v1" // futex doorbells
	ringsDataPathV2   = "kvfence-rings/v2" // pipe doorbells (ring/pipebell.go)
)

// DataPath names how Post and Completion cross the plugin boundary.
type DataPath string

const (
	DataPathRings DataPath = "rings" // shared-memory rings
	DataPathGRPC  DataPath = "grpc"  // one gRPC call per Post, completions on the stream
)

// hostRings is the host's end of the rings: it produces submissions and
// consumes completions. A synchronous Post (OpenOptions.SyncPost) waits
// for its plugin's verdict on a channel the consumer fills.
type hostRings struct {
	shm   *SharedMemory
	bells []*os.File // the doorbell pipes, both ends (v2; none with v1)
	sub   *ring.Ring // host produces
	comp  *ring.Ring // host consumes

	mu      sync.Mutex // the submission ring's one producer
	closed  bool
	seq     uint64
	enc     []byte // a Post record being written (under mu)
	waiters map[uint64]chan error
	// async: Post returns once its batch is in the ring (the default;
	// off with OpenOptions.SyncPost); the verdict then settles unanswered[seq]: nothing when
	// accepted, a FailedDefinite completion when refused. Set before the
	// first Post.
	async      bool
	unanswered map[uint64]BatchID

	stop    chan struct{} // consumer: drain what is there and exit
	stopped chan struct{} // consumer exited
	dead    chan struct{} // closed once no verdict can come any more

	backlogMu sync.Mutex
	backlog   []Completion // completions waiting for room in the host's out
	flushing  sync.WaitGroup

	host      *remote
	violation func(detail string) // the plugin broke the ring format: stop trusting it
}

// attachRings offers the plugin a pair of rings. It returns nil (and no
// error) when the plugin does not know them or the host disabled them.
// KVFENCE_RINGS=v1 offers only the futex doorbells (as older hosts do).
func attachRings(ctx context.Context, conn grpc.ClientConnInterface, host *remote, violation func(string)) (*hostRings, error) {
	if os.Getenv(envRings) == "off" {
		return nil, nil
	}
	if os.Getenv(envRings) != "v1" {
		h, err := offerRings(ctx, conn, host, violation, true)
		if err == nil || (!errors.Is(err, errNoPipes) && errdefs.ClassOf(err) != errdefs.InvalidArgument) {
			return h, err
		}
		// a plugin that knows only v1 (or cannot open the pipes), or no pipes here
	}
	return offerRings(ctx, conn, host, violation, false)
}

// offerRings makes a layout (and, with pipes, the two doorbell pipes) and
// offers it; nil, nil when the plugin does not know the rings at all.
func offerRings(ctx context.Context, conn grpc.ClientConnInterface, host *remote, violation func(string), pipes bool) (*hostRings, error) {
	capacity := uint64(ring.DefaultSize)
	shm, err := NewSharedMemory("rings", ring.LayoutSize(capacity))
	if err != nil {
		return nil, err
	}
	ring.InitLayout(shm.Bytes(), capacity)
	h := &hostRings{
		shm: shm, sub: ring.Submission(shm.Bytes(), capacity), comp: ring.Completion(shm.Bytes(), capacity),
		waiters: map[uint64]chan error{}, unanswered: map[uint64]BatchID{}, stop: make(chan struct{}), stopped: make(chan struct{}), dead: make(chan struct{}),
		host: host, violation: violation,
	}
	offer := &pb.Endpoint{Transport: ringsDataPath, Address: shm.Desc().Path, Opaque: binary.LittleEndian.AppendUint64(nil, capacity)}
	if pipes {
		paths, err := h.pipeBells()
		if err != nil {
			h.release()
			return nil, fmt.Errorf("%w: %v", errNoPipes, err)
		}
		offer.Transport, offer.Opaque = ringsDataPathV2, append(offer.Opaque, paths...)
	}
	var res pb.Endpoint
	err = conn.Invoke(ctx, ringsAttachMethod, offer, &res)
	if err != nil || res.GetTransport() != offer.Transport {
		h.release()
		if err != nil && errdefs.ClassOf(fromStatusError(err)) != errdefs.Unimplemented {
			return nil, fromStatusError(err)
		}
		return nil, nil // an older plugin: gRPC Post
	}
	go h.consume()
	return h, nil
}

// errNoPipes: this host could not make the doorbell pipes; it offers v1.
var errNoPipes = errors.New("rings: no doorbell pipes")

// pipeBells makes the two doorbell pipes (the host keeps both ends of
// each, so neither ever sees its peer gone) and returns their paths as
// offered: submissions' (the plugin waits on it), newline, completions'.
func (h *hostRings) pipeBells() ([]byte, error) {
	subR, subW, subPath, err := ring.Pipe()
	if err != nil {
		return nil, err
	}
	h.bells = append(h.bells, subR, subW)
	compR, compW, compPath, err := ring.Pipe()
	if err != nil {
		return nil, err
	}
	h.bells = append(h.bells, compR, compW)
	if err := h.sub.UsePipe(nil, subW); err != nil {
		return nil, err
	}
	if err := h.comp.UsePipe(compR, compW); err != nil {
		return nil, err
	}
	return []byte(subPath + "\n" + compPath), nil
}

// maxKeptRecord bounds the Post record buffer a host keeps for the next
// Post (a rare batch of many operations is not held on to).
const maxKeptRecord = 64 << 10

// errRingUnsent: the batch never entered the ring (too big, or the rings
// are closed); the caller may use gRPC instead.
var errRingUnsent = errors.New("not sent on the ring")

// errRingNoVerdict: the batch is in the ring but no verdict came (the
// plugin was lost, or ctx ended): its outcome is unknown.
var errRingNoVerdict = errors.New("no verdict from the plugin")

// post submits b and waits for the plugin's verdict: nil (accepted), a
// classified error (refused), errRingUnsent or errRingNoVerdict. With
// async it returns nil once b is in the ring, and a refusal comes later
// as b's completion (handle).
func (h *hostRings) post(ctx context.Context, b Batch) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return errRingUnsent
	}
	payload, ok := appendPostRecord(h.enc[:0], b)
	if cap(payload) <= maxKeptRecord {
		h.enc = payload[:0] // the record's buffer, reused: Put copies it into the ring
	}
	if !ok || uint64(len(payload)) > h.sub.MaxPayload() {
		h.mu.Unlock()
		return errRingUnsent
	}
	h.seq++
	seq := h.seq
	var err error
	for {
		err = h.sub.Put(ring.RecPost, seq, payload)
		if !errors.Is(err, ring.ErrFull) {
			break
		}
		h.sub.Publish()
		if !ring.WaitRoom(h.dead) {
			break
		}
	}
	if err != nil {
		h.mu.Unlock()
		if errors.Is(err, ring.ErrCorrupt) {
			h.violation("submission ring head moved impossibly")
		}
		return errRingUnsent
	}
	if h.async {
		h.unanswered[seq] = b.ID
		h.sub.Publish()
		h.mu.Unlock()
		return nil
	}
	verdict := make(chan error, 1)
	h.waiters[seq] = verdict
	h.sub.Publish()
	h.mu.Unlock()
	select {
	case err := <-verdict:
		return err
	case <-h.dead:
		return errRingNoVerdict
	case <-ctx.Done():
		h.mu.Lock()
		delete(h.waiters, seq)
		h.mu.Unlock()
		return errRingNoVerdict
	}
}

// consume reads completions and verdicts until stopped, then drains what
// the plugin published before its stream ended.
func (h *hostRings) consume() {
	defer close(h.stopped)
	var buf []byte
	for {
		select {
		case <-h.stop:
			h.drain(buf)
			return
		default:
		}
		h.comp.Wait(h.stop)
		var ok bool
		if buf, ok = h.drain(buf); !ok {
			<-h.stop
			return
		}
	}
}

// drain handles every published record; false when the ring is corrupt.
func (h *hostRings) drain(buf []byte) ([]byte, bool) {
	for {
		kind, seq, payload, b, ok, err := h.comp.Next(buf)
		buf = b
		if err != nil {
			h.violation("completion ring: " + err.Error())
			return buf, false
		}
		if !ok {
			return buf, true
		}
		if detail := h.handle(kind, seq, payload); detail != "" {
			h.violation(detail)
			return buf, false
		}
	}
}

// complete passes a completion to the host without ever blocking the
// consumer: verdicts queue behind completions in the ring, so a consumer
// blocked on a full out would hold up Posts whose caller is the one who
// reads completions. When out is full, or older ones still wait, it
// queues, and a flusher delivers them in order.
func (h *hostRings) complete(c Completion) {
	if !h.host.admit(c) {
		return
	}
	h.backlogMu.Lock()
	defer h.backlogMu.Unlock()
	if len(h.backlog) == 0 && h.host.tryEmit(c) {
		return
	}
	h.backlog = append(h.backlog, c)
	if len(h.backlog) == 1 {
		h.flushing.Add(1)
		go h.flush()
	}
}

func (h *hostRings) flush() {
	defer h.flushing.Done()
	for {
		h.backlogMu.Lock()
		if len(h.backlog) == 0 {
			h.backlogMu.Unlock()
			return
		}
		c := h.backlog[0]
		h.backlogMu.Unlock()
		h.host.emit(c) // may block until the caller reads
		h.backlogMu.Lock()
		h.backlog = h.backlog[1:]
		h.backlogMu.Unlock()
	}
}

// handle dispatches one record; it returns why the record is invalid.
func (h *hostRings) handle(kind uint16, seq uint64, payload []byte) string {
	switch kind {
	case ring.RecCompletion:
		c, _, err := decodeCompletionRecord(payload)
		if err != nil {
			return "completion record: " + err.Error()
		}
		h.complete(c)
	case ring.RecPostOK, ring.RecPostErr:
		var verdict error
		if kind == ring.RecPostErr {
			c, class, err := decodeCompletionRecord(payload)
			if err != nil {
				return "post verdict record: " + err.Error()
			}
			verdict = errdefs.Errorf(refusalClass(class), "%s", c.Detail)
		}
		h.mu.Lock()
		w, ok := h.waiters[seq]
		delete(h.waiters, seq)
		id, async := h.unanswered[seq]
		delete(h.unanswered, seq)
		h.mu.Unlock()
		switch {
		case ok:
			w <- verdict
		case async && verdict != nil:
			h.refused(id, verdict)
		case async:
		case seq == 0 || seq > h.postedSeq():
			return fmt.Sprintf("verdict for post %d that was never submitted", seq)
		}
		// else: a verdict for a Post whose caller gave up; its batch is
		// already InDoubt on the host side.
	default:
		return fmt.Sprintf("unknown record kind %d", kind)
	}
	return ""
}

// refused completes an asynchronous Post's batch that the plugin refused.
// Its caller was told "in the ring", so the refusal becomes the batch's
// one completion: FailedDefinite (a refused batch moved no byte), with the
// refusal's class.
func (h *hostRings) refused(id BatchID, refusal error) {
	h.complete(Completion{Batch: id, Status: FailedDefinite, Class: errdefs.ClassOf(refusal), Detail: "Post refused: " + refusal.Error()})
}

func (h *hostRings) postedSeq() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// shutdown runs when the completion stream ended: read what the plugin
// published before that, then release every waiting Post (no verdict can
// come any more), and unmap.
func (h *hostRings) shutdown() {
	close(h.stop)
	h.comp.Interrupt()
	<-h.stopped
	h.flushing.Wait() // delivered before lose declares the rest InDoubt
	h.mu.Lock()
	h.closed = true
	close(h.dead)
	h.mu.Unlock()
}

// release unmaps the rings; only after shutdown and once no Post can
// still touch them (closed is set under mu, which every put holds).
func (h *hostRings) release() {
	_ = h.shm.Close()
	for _, f := range h.bells {
		_ = f.Close()
	}
}

// refusalClass is the class of a plugin's refusal as the host will
// report it: a class outside the vocabulary (or none) is a plugin bug,
// reported as Internal like an unclassified gRPC error.
func refusalClass(wire uint32) errdefs.Class {
	for _, c := range errdefs.Classes {
		if uint32(c) == wire && c != errdefs.Unknown {
			return c
		}
	}
	return errdefs.Internal
}

// DataPath says whether Post and Completion cross the boundary on the
// shared-memory rings or over gRPC (an older plugin, or KVFENCE_RINGS=off).
func (p *Plugin) DataPath() DataPath { return p.remote.dataPath() }

func (r *remote) dataPath() DataPath {
	if r.rings != nil {
		return DataPathRings
	}
	return DataPathGRPC
}

// AsyncPost says whether Post returns before the plugin's verdict (on
// the rings, unless the host asked for OpenOptions.SyncPost).
func (p *Plugin) AsyncPost() bool { return p.remote.rings != nil && p.remote.rings.async }

// setAsyncPost turns asynchronous Post on; only before the first Post,
// and only on the rings (over gRPC the contract stays synchronous).
func (r *remote) setAsyncPost(on bool) {
	if r.rings != nil {
		r.rings.mu.Lock()
		r.rings.async = on
		var flags uint32
		if on {
			flags = ring.QuietAccepts
		}
		ring.HostFlags(r.rings.shm.Bytes()).Store(flags)
		r.rings.mu.Unlock()
	}
}
