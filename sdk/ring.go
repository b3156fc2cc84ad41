package sdk

import (
	"encoding/binary"
	"errors"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

// The data path between host and plugin: two single-producer,
// single-consumer byte rings in one shared memfd — submissions (Post,
// host to plugin) and completions (Post results and Completions, plugin
// to host). gRPC keeps the control calls and the completion stream, whose
// end is still how the host learns that a plugin is gone.
//
// Each side trusts only what it writes itself: the producer keeps its tail
// and the consumer its head in private memory and only publishes them, so
// a plugin that scribbles over the shared pages can make the host see
// garbage records (which it rejects) but can never move the host's own
// indices. A record is published by one atomic store of the tail after
// every byte of it is written, and the consumer copies it out of shared
// memory once before parsing it, so a record is never half-read and never
// read twice (no double fetch).

// ring memory layout: a control page, then the two data areas.
const (
	ringMagic        = 0x31474e4952464b56 // "VKFRING1" little endian
	ringVersion      = 1
	ringCtrlSize     = 4096
	ringSubCtrl      = 256 // submission ring's control block
	ringCompCtrl     = 512 // completion ring's control block
	ringHeaderSize   = 16  // length u32, kind u16, reserved u16, seq u64
	ringRecordAlign  = 16
	ringMinCapacity  = 4096
	ringMaxCapacity  = 64 << 20
	ringDefaultSize  = 1 << 20
	ctrlTailOff      = 0   // producer's published tail (bytes ever written)
	ctrlHeadOff      = 64  // consumer's published head (bytes ever consumed)
	ctrlSleepingOff  = 128 // consumer is (about to be) asleep on the bell
	ctrlBellOff      = 192 // futex word the producer bumps to wake it
	ringSleepTimeout = 50 * time.Millisecond
)

// record kinds
const (
	recWrap       uint16 = 1 // rest of the area is padding; continue at 0
	recPost       uint16 = 2 // host→plugin: a PostRequest, seq = host's post sequence
	recPostOK     uint16 = 3 // plugin→host: Post seq accepted
	recPostErr    uint16 = 4 // plugin→host: Post seq refused; payload Completion{ErrorClass, Detail}
	recCompletion uint16 = 5 // plugin→host: a Completion
)

var (
	errRingFull    = errors.New("ring full")
	errRingTooBig  = errors.New("record larger than the ring allows")
	errRingCorrupt = errors.New("ring corrupt")
)

// ringLayoutSize is the memfd size for two rings of capacity each.
func ringLayoutSize(capacity uint64) uint64 { return ringCtrlSize + 2*capacity }

// validRingCapacity: a power of two within bounds, so positions map to
// offsets by masking and the wrap arithmetic cannot overflow.
func validRingCapacity(c uint64) bool {
	return c >= ringMinCapacity && c <= ringMaxCapacity && c&(c-1) == 0
}

// initRingLayout writes the header of a fresh layout (host only).
func initRingLayout(mem []byte, capacity uint64) {
	binary.LittleEndian.PutUint64(mem[0:], ringMagic)
	binary.LittleEndian.PutUint32(mem[8:], ringVersion)
	binary.LittleEndian.PutUint64(mem[16:], capacity)
}

// checkRingLayout validates a layout the host made (plugin side).
func checkRingLayout(mem []byte, capacity uint64) error {
	if !validRingCapacity(capacity) || uint64(len(mem)) < ringLayoutSize(capacity) {
		return errdefs.Errorf(errdefs.InvalidArgument, "rings: capacity %d does not fit %d bytes", capacity, len(mem))
	}
	if binary.LittleEndian.Uint64(mem[0:]) != ringMagic || binary.LittleEndian.Uint32(mem[8:]) != ringVersion ||
		binary.LittleEndian.Uint64(mem[16:]) != capacity {
		return errdefs.Errorf(errdefs.InvalidArgument, "rings: bad magic, version or capacity")
	}
	return nil
}

// ring is one side's view of one ring. A producer owns pos as its tail, a
// consumer as its head; the peer's index is read from shared memory and
// validated against pos every time.
type ring struct {
	data     []byte
	mask     uint64
	capacity uint64
	tail     *atomic.Uint64
	head     *atomic.Uint64
	sleeping *atomic.Uint32
	bell     *atomic.Uint32
	pos      uint64
	hdr      [ringHeaderSize]byte
	spin     time.Duration // adaptive: how long the consumer polls before sleeping
}

// submissionRing and completionRing are views into a layout.
func submissionRing(mem []byte, capacity uint64) *ring {
	return newRing(mem[ringSubCtrl:], mem[ringCtrlSize:ringCtrlSize+capacity], capacity)
}

func completionRing(mem []byte, capacity uint64) *ring {
	return newRing(mem[ringCompCtrl:], mem[ringCtrlSize+capacity:ringCtrlSize+2*capacity], capacity)
}

func newRing(ctrl, data []byte, capacity uint64) *ring {
	at := func(off int) unsafe.Pointer { return unsafe.Pointer(&ctrl[off]) }
	return &ring{
		data: data, mask: capacity - 1, capacity: capacity,
		tail:     (*atomic.Uint64)(at(ctrlTailOff)),
		head:     (*atomic.Uint64)(at(ctrlHeadOff)),
		sleeping: (*atomic.Uint32)(at(ctrlSleepingOff)),
		bell:     (*atomic.Uint32)(at(ctrlBellOff)),
	}
}

// maxRingPayload is the largest payload one record may carry: a quarter
// of the ring, so a full-size record always fits once the ring drains.
func (r *ring) maxPayload() uint64 { return r.capacity/4 - ringHeaderSize }

func alignRecord(n uint64) uint64 { return (n + ringRecordAlign - 1) &^ (ringRecordAlign - 1) }

// put appends one record without ringing the bell; it returns errRingFull
// when there is no room now, and errRingCorrupt when the consumer's head
// is impossible. The record is visible to the consumer only at publish.
func (r *ring) put(kind uint16, seq uint64, payload []byte) error {
	if uint64(len(payload)) > r.maxPayload() {
		return errRingTooBig
	}
	head := r.head.Load()
	if head > r.pos || r.pos-head > r.capacity {
		return errRingCorrupt
	}
	free := r.capacity - (r.pos - head)
	n := alignRecord(ringHeaderSize + uint64(len(payload)))
	off := r.pos & r.mask
	contiguous := r.capacity - off
	need := n
	if n > contiguous {
		need += contiguous
	}
	if need > free {
		return errRingFull
	}
	if n > contiguous {
		putRecordHeader(r.data[off:], 0, recWrap, 0)
		r.pos += contiguous
		off = 0
	}
	putRecordHeader(r.data[off:], uint32(len(payload)), kind, seq)
	copy(r.data[off+ringHeaderSize:], payload)
	r.pos += n
	return nil
}

// publish makes every record put so far visible, and wakes the consumer
// if it sleeps. Several puts under one publish are one doorbell: batching.
func (r *ring) publish() {
	r.publishQuiet()
	r.ring()
}

// publishQuiet makes the records visible to a consumer that is awake (or
// polling) without the doorbell's syscall; a later ring wakes a sleeper.
func (r *ring) publishQuiet() { r.tail.Store(r.pos) }

// ring wakes the consumer if it sleeps.
func (r *ring) ring() {
	if r.sleeping.Load() != 0 {
		r.bell.Add(1)
		futexWake(r.bell)
	}
}

func putRecordHeader(b []byte, length uint32, kind uint16, seq uint64) {
	binary.LittleEndian.PutUint32(b[0:], length)
	binary.LittleEndian.PutUint16(b[4:], kind)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], seq)
}

// next reads the next record into buf (grown as needed) and returns its
// kind, seq and payload (a slice of buf: private memory, copied once from
// the ring). ok is false when no record is published. errRingCorrupt
// means the producer broke the format: the caller stops trusting it.
func (r *ring) next(buf []byte) (kind uint16, seq uint64, payload, grown []byte, ok bool, err error) {
	for {
		tail := r.tail.Load()
		if tail < r.pos || tail-r.pos > r.capacity {
			return 0, 0, nil, buf, false, errRingCorrupt
		}
		avail := tail - r.pos
		if avail == 0 {
			return 0, 0, nil, buf, false, nil
		}
		off := r.pos & r.mask
		contiguous := r.capacity - off
		if avail < ringHeaderSize || off%ringRecordAlign != 0 {
			return 0, 0, nil, buf, false, errRingCorrupt
		}
		copy(r.hdr[:], r.data[off:off+ringHeaderSize])
		length := uint64(binary.LittleEndian.Uint32(r.hdr[0:]))
		kind = binary.LittleEndian.Uint16(r.hdr[4:])
		seq = binary.LittleEndian.Uint64(r.hdr[8:])
		if kind == recWrap {
			if contiguous > avail || off == 0 {
				return 0, 0, nil, buf, false, errRingCorrupt
			}
			r.pos += contiguous
			r.head.Store(r.pos)
			continue
		}
		n := alignRecord(ringHeaderSize + length)
		if length > r.maxPayload() || n > contiguous || n > avail {
			return 0, 0, nil, buf, false, errRingCorrupt
		}
		if uint64(cap(buf)) < length {
			buf = make([]byte, length, max(length, 512))
		}
		payload = buf[:length]
		copy(payload, r.data[off+ringHeaderSize:off+ringHeaderSize+length])
		r.pos += n
		r.head.Store(r.pos)
		return kind, seq, payload, buf, true, nil
	}
}

// available reports whether a record (or garbage) is published.
func (r *ring) available() bool { return r.tail.Load() != r.pos }

// Adaptive polling: a consumer polls (yielding) for up to r.spin before it
// sleeps on the bell. Finding work while polling adds ringSpinStep to
// the budget (up to ringSpinMax); having to sleep halves it. It starts at
// zero: on a machine with few, busy cores polling steals the CPU the
// other side needs (measured: pure sleeping was fastest on 2 shared
// cores), and it grows only where polling pays.
const (
	ringSpinStep = 2 * time.Microsecond
	ringSpinMax  = 50 * time.Microsecond
)

// wait returns when a record is published, stop is closed, or after
// ringSleepTimeout. It polls for r.spin first, then sleeps on the bell.
func (r *ring) wait(stop <-chan struct{}) {
	if r.available() {
		return
	}
	start := time.Now()
	for i := 0; ; i++ {
		if r.available() {
			r.spin = min(ringSpinMax, r.spin+ringSpinStep)
			return
		}
		if i&7 == 7 && time.Since(start) >= r.spin {
			break
		}
		runtime.Gosched()
	}
	r.spin /= 2
	bell := r.bell.Load()
	r.sleeping.Store(1)
	defer r.sleeping.Store(0)
	if r.available() {
		return
	}
	select {
	case <-stop:
		return
	default:
	}
	futexWait(r.bell, bell, ringSleepTimeout)
}

// interrupt wakes this ring's consumer from its sleep (it was told to
// stop): the bell is loaded before the stop check in wait, so a wake that
// comes between them still ends the futex wait at once.
func (r *ring) interrupt() {
	r.bell.Add(1)
	futexWake(r.bell)
}

// waitRoom is the producer's side of a full ring: rare (the consumer
// drains continuously), so it just naps until there is room.
func waitRoom(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	case <-time.After(20 * time.Microsecond):
		return true
	}
}
