package ring

import (
	"encoding/binary"
	"errors"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

// ring memory layout: a control page, then the two data areas.
const (
	ringMagic        = 0x31474e4952464b56 // "VKFRING1" little endian
	ringVersion      = 1
	ringCtrlSize     = 4096
	ringSubCtrl      = 256 // submission ring's control block
	ringCompCtrl     = 512 // completion ring's control block
	HeaderSize       = 16  // length u32, kind u16, reserved u16, seq u64
	ringRecordAlign  = 16
	MinCapacity      = 4096
	ringMaxCapacity  = 64 << 20
	DefaultSize      = 1 << 20
	ctrlTailOff      = 0   // producer's published tail (bytes ever written)
	ctrlHeadOff      = 64  // consumer's published head (bytes ever consumed)
	ctrlSleepingOff  = 128 // consumer is (about to be) asleep on the bell
	ctrlBellOff      = 192 // futex word the producer bumps to wake it
	ringSleepTimeout = 50 * time.Millisecond
	// ringHostFlagsOff is a word of the control page that the host writes
	// and the plugin only reads (a layout made by an older host has zero
	// there, and an older plugin never reads it).
	ringHostFlagsOff = 32
)

// Host flags (the word at ringHostFlagsOff).
const (
	// QuietAccepts: the host's Post is asynchronous, so nobody waits
	// for an accepted Post's verdict; the plugin publishes it without the
	// doorbell (the next completion's, or a refusal's, wakes the host and
	// it drains them). A refusal still rings: it is the batch's completion.
	QuietAccepts uint32 = 1
)

// HostFlags is the host flags word of a layout.
func HostFlags(mem []byte) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[ringHostFlagsOff]))
}

// record kinds
const (
	recWrap       uint16 = 1 // rest of the area is padding; continue at 0
	RecPost       uint16 = 2 // host→plugin: a PostRequest, seq = host's post sequence
	RecPostOK     uint16 = 3 // plugin→host: Post seq accepted
	RecPostErr    uint16 = 4 // plugin→host: Post seq refused; payload Completion{ErrorClass, Detail}
	RecCompletion uint16 = 5 // plugin→host: a Completion
)

var (
	ErrFull    = errors.New("ring full")
	ErrTooBig  = errors.New("record larger than the ring allows")
	ErrCorrupt = errors.New("ring corrupt")
)

// LayoutSize is the memfd size for two rings of capacity each.
func LayoutSize(capacity uint64) uint64 { return ringCtrlSize + 2*capacity }

// ValidCapacity: a power of two within bounds, so positions map to
// offsets by masking and the wrap arithmetic cannot overflow.
func ValidCapacity(c uint64) bool {
	return c >= MinCapacity && c <= ringMaxCapacity && c&(c-1) == 0
}

// InitLayout writes the header of a fresh layout (host only).
func InitLayout(mem []byte, capacity uint64) {
	binary.LittleEndian.PutUint64(mem[0:], ringMagic)
	binary.LittleEndian.PutUint32(mem[8:], ringVersion)
	binary.LittleEndian.PutUint64(mem[16:], capacity)
}

// CheckLayout validates a layout the host made (plugin side).
func CheckLayout(mem []byte, capacity uint64) error {
	if !ValidCapacity(capacity) || uint64(len(mem)) < LayoutSize(capacity) {
		return errdefs.Errorf(errdefs.InvalidArgument, "rings: capacity %d does not fit %d bytes", capacity, len(mem))
	}
	if binary.LittleEndian.Uint64(mem[0:]) != ringMagic || binary.LittleEndian.Uint32(mem[8:]) != ringVersion ||
		binary.LittleEndian.Uint64(mem[16:]) != capacity {
		return errdefs.Errorf(errdefs.InvalidArgument, "rings: bad magic, version or capacity")
	}
	return nil
}

// Ring is one side's view of one ring. A producer owns pos as its tail, a
// consumer as its head; the peer's index is read from shared memory and
// validated against pos every time.
type Ring struct {
	data     []byte
	mask     uint64
	capacity uint64
	tail     *atomic.Uint64
	head     *atomic.Uint64
	sleeping *atomic.Uint32
	bell     *atomic.Uint32
	pos      uint64
	hdr      [HeaderSize]byte
	spin     time.Duration // adaptive: how long the consumer polls before sleeping
	pipe     *pipeBell     // the doorbell is a pipe (layout v2); nil: the futex
	sleepFor time.Duration // one sleep's bound; 0: ringSleepTimeout (tests lengthen it)
	wakes    atomic.Uint64 // futex wakes this side issued (private memory)
}

// Submission and Completion are views into a layout.
func Submission(mem []byte, capacity uint64) *Ring {
	return newRing(mem[ringSubCtrl:], mem[ringCtrlSize:ringCtrlSize+capacity], capacity)
}

func Completion(mem []byte, capacity uint64) *Ring {
	return newRing(mem[ringCompCtrl:], mem[ringCtrlSize+capacity:ringCtrlSize+2*capacity], capacity)
}

func newRing(ctrl, data []byte, capacity uint64) *Ring {
	at := func(off int) unsafe.Pointer { return unsafe.Pointer(&ctrl[off]) }
	return &Ring{
		data: data, mask: capacity - 1, capacity: capacity,
		tail:     (*atomic.Uint64)(at(ctrlTailOff)),
		head:     (*atomic.Uint64)(at(ctrlHeadOff)),
		sleeping: (*atomic.Uint32)(at(ctrlSleepingOff)),
		bell:     (*atomic.Uint32)(at(ctrlBellOff)),
	}
}

// MaxPayload is the largest payload one record may carry: a quarter
// of the ring, so a full-size record always fits once the ring drains.
func (r *Ring) MaxPayload() uint64 { return r.capacity/4 - HeaderSize }

func alignRecord(n uint64) uint64 { return (n + ringRecordAlign - 1) &^ (ringRecordAlign - 1) }

// Put appends one record without ringing the bell; it returns ErrFull
// when there is no room now, and ErrCorrupt when the consumer's head
// is impossible. The record is visible to the consumer only at Publish.
func (r *Ring) Put(kind uint16, seq uint64, payload []byte) error {
	if uint64(len(payload)) > r.MaxPayload() {
		return ErrTooBig
	}
	head := r.head.Load()
	if head > r.pos || r.pos-head > r.capacity {
		return ErrCorrupt
	}
	free := r.capacity - (r.pos - head)
	n := alignRecord(HeaderSize + uint64(len(payload)))
	off := r.pos & r.mask
	contiguous := r.capacity - off
	need := n
	if n > contiguous {
		need += contiguous
	}
	if need > free {
		return ErrFull
	}
	if n > contiguous {
		PutRecordHeader(r.data[off:], 0, recWrap, 0)
		r.pos += contiguous
		off = 0
	}
	PutRecordHeader(r.data[off:], uint32(len(payload)), kind, seq)
	copy(r.data[off+HeaderSize:], payload)
	r.pos += n
	return nil
}

// Publish makes every record put so far visible, and wakes the consumer
// if it sleeps. Several puts under one publish are one doorbell: batching.
func (r *Ring) Publish() {
	r.PublishQuiet()
	r.Doorbell()
}

// PublishQuiet makes the records visible to a consumer that is awake (or
// polling) without the doorbell's syscall; a later ring wakes a sleeper.
func (r *Ring) PublishQuiet() { r.tail.Store(r.pos) }

// Doorbell wakes the consumer if it sleeps: once per sleep. The first ring
// after the consumer announced its sleep takes the announcement (1 → 0)
// and pays the syscall; the rings that follow before it runs again find
// it taken and cost one atomic load. The bell moves before the wake, so a
// consumer between its announcement and its futex wait does not sleep.
func (r *Ring) Doorbell() {
	if r.sleeping.Load() != 0 && r.sleeping.CompareAndSwap(1, 0) {
		r.wakes.Add(1)
		r.wake()
	}
}

// Wakes is how many times this side woke the consumer (Doorbell's
// syscalls), for the tests that hold batching to its promise.
func (r *Ring) Wakes() uint64 { return r.wakes.Load() }

func PutRecordHeader(b []byte, length uint32, kind uint16, seq uint64) {
	binary.LittleEndian.PutUint32(b[0:], length)
	binary.LittleEndian.PutUint16(b[4:], kind)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], seq)
}

// Next reads the next record into buf (grown as needed) and returns its
// kind, seq and payload (a slice of buf: private memory, copied once from
// the ring). ok is false when no record is published. ErrCorrupt
// means the producer broke the format: the caller stops trusting it.
func (r *Ring) Next(buf []byte) (kind uint16, seq uint64, payload, grown []byte, ok bool, err error) {
	for {
		tail := r.tail.Load()
		if tail < r.pos || tail-r.pos > r.capacity {
			return 0, 0, nil, buf, false, ErrCorrupt
		}
		avail := tail - r.pos
		if avail == 0 {
			return 0, 0, nil, buf, false, nil
		}
		off := r.pos & r.mask
		contiguous := r.capacity - off
		if avail < HeaderSize || off%ringRecordAlign != 0 {
			return 0, 0, nil, buf, false, ErrCorrupt
		}
		copy(r.hdr[:], r.data[off:off+HeaderSize])
		length := uint64(binary.LittleEndian.Uint32(r.hdr[0:]))
		kind = binary.LittleEndian.Uint16(r.hdr[4:])
		seq = binary.LittleEndian.Uint64(r.hdr[8:])
		if kind == recWrap {
			if contiguous > avail || off == 0 {
				return 0, 0, nil, buf, false, ErrCorrupt
			}
			r.pos += contiguous
			r.head.Store(r.pos)
			continue
		}
		n := alignRecord(HeaderSize + length)
		if length > r.MaxPayload() || n > contiguous || n > avail {
			return 0, 0, nil, buf, false, ErrCorrupt
		}
		if uint64(cap(buf)) < length {
			buf = make([]byte, length, max(length, 512))
		}
		payload = buf[:length]
		copy(payload, r.data[off+HeaderSize:off+HeaderSize+length])
		r.pos += n
		r.head.Store(r.pos)
		return kind, seq, payload, buf, true, nil
	}
}

// Available reports whether a record (or garbage) is published.
func (r *Ring) Available() bool { return r.tail.Load() != r.pos }

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

// Wait returns when a record is published, stop is closed, or after
// ringSleepTimeout. It polls for r.spin first, then sleeps on the bell.
func (r *Ring) Wait(stop <-chan struct{}) {
	if r.Available() {
		return
	}
	start := time.Now()
	for i := 0; ; i++ {
		if r.Available() {
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
	if r.Available() {
		return
	}
	select {
	case <-stop:
		return
	default:
	}
	d := ringSleepTimeout
	if r.sleepFor > 0 {
		d = r.sleepFor
	}
	if r.pipe != nil {
		r.pipe.sleep(d)
		return
	}
	futexWait(r.bell, bell, d)
}

// wake rings the bell: a byte on the pipe, or the futex word moved before
// its wake (so a consumer between loading it and its futex wait does not
// sleep).
func (r *Ring) wake() {
	if r.pipe != nil {
		r.pipe.ringPipe()
		return
	}
	r.bell.Add(1)
	futexWake(r.bell)
}

// Interrupt wakes this ring's consumer from its sleep (it was told to
// stop): the futex word is loaded before the stop check in wait, and a
// pipe's byte stays until read, so a wake that comes between them still
// ends the sleep at once.
func (r *Ring) Interrupt() { r.wake() }

// WaitRoom is the producer's side of a full ring: rare (the consumer
// drains continuously), so it just naps until there is room.
func WaitRoom(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	case <-time.After(20 * time.Microsecond):
		return true
	}
}
