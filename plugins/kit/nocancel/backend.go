package nocancel

import (
	"time"
)

// Segment names an opened remote peer in the backend.
type Segment int64

// Job is a submitted backend batch (for Mooncake a raw pointer: it must not
// be used after Free).
type Job uint64

// Write is one write of a job: local source address, remote absolute
// address, length.
type Write struct {
	Src, Dst uintptr
	Length   uint64
}

// Backend is what a vendor binding provides. Methods are called from one
// goroutine at a time per Job, but Submit and Poll of different jobs may
// run concurrently; a binding serialises what its library needs.
type Backend interface {
	// Name of the backend and its library's version as far as it is known.
	Name() string
	Version() string
	// LocalName is what a peer passes to Open to reach this process.
	LocalName() string
	// Register/Unregister make [addr, addr+n) a source or a target.
	Register(addr uintptr, n uint64) error
	Unregister(addr uintptr) error
	// Open prepares a remote peer by the name it published and the
	// metadata its directory serves (nil for backends without any). It is
	// called again with fresh metadata before a new key of the peer is
	// used, since the peer may have registered memory meanwhile.
	Open(name string, metadata []byte) (Segment, error)
	// Metadata is what peers need to load to reach this process's
	// registered memory (NIXL: the agent's metadata), or nil.
	Metadata() []byte
	// Submit hands writes to the backend. A plain error means nothing of
	// them was or will be moved (the binding returns one only when the
	// library's submit was never called), classified. Once the library's
	// submit was called, a refusal is a *SubmitRefused carrying the job:
	// the library may have sent part of it (Mooncake over RDMA posts
	// slices as they accumulate and can still refuse a later one).
	Submit(seg Segment, ws []Write) (Job, error)
	// Poll reads one task's state. An error says nothing about the task:
	// it is polled again.
	Poll(j Job, task int) (Task, error)
	// Free releases a job whose every task was polled terminal. A binding
	// whose library refuses (Mooncake: BatchBusy) returns an error; the job
	// is then tried again later.
	Free(j Job) error
	// Confirms says whether Completed means applied at the target on links
	// to a peer that published framing (see Hello).
	Confirms(peerFraming string) bool
	// Framing is what this process publishes to its peers about its link:
	// for Mooncake over TCP, "v2" when the server acknowledges after
	// applying, "legacy" otherwise.
	Framing() string
}

// SubmitRefused is a refusal from a library submit that was called: part
// of the job may have left. The transport keeps the job, pins its
// sources, polls every task to a terminal state and reports the batch
// InDoubt whatever its tasks read (an older Mooncake reads a never-posted
// task COMPLETED); Post returns no error, since an error promises that
// nothing moved.
type SubmitRefused struct {
	Job Job
	Err error
}

func (e *SubmitRefused) Error() string { return "submit refused after it was called: " + e.Err.Error() }
func (e *SubmitRefused) Unwrap() error { return e.Err }

// UnboundedTail is the MaxTail of a transport whose late bytes have no
// bound while the target process lives (Mooncake over TCP: a write to a
// stopped target stays WAITING for as long as it is stopped, and lands when
// it resumes). The contract has no value for "never"; this one is long
// enough that no hold ends by timeout, and small enough that the core's sums
// (lease + MaxHold + tail + margin) cannot overflow a time.Duration. Memory
// such a transport writes is freed by drain, or by ending the target
// process (process-exited evidence), never by the timeout.
const UnboundedTail = 50 * 365 * 24 * time.Hour
