package sdk

import (
	"fmt"
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// RegionID names memory registered with a transport (local to one plugin).
type RegionID uint64

// Key names one exposure: a granted window of a registered region that remote
// peers may write into (or read from). Keys are chosen by the receiving
// transport and must be hard to guess; zero is never a valid key.
type Key uint64

// BatchID is chosen by the caller of Post and must be unique for the life of
// the transport instance.
type BatchID uint64

// PeerID names a connected remote endpoint; it is chosen by the transport.
type PeerID string

// MemoryKind says how memory reaches the plugin.
type MemoryKind uint8

const (
	// MemoryHostShared is host memory backed by a memfd or /dev/shm file that
	// host and plugin both map (MAP_SHARED): no copies, no payload over gRPC.
	MemoryHostShared MemoryKind = 1
	// MemoryDMABuf is device (GPU) memory exported as a dma-buf file
	// descriptor. The plugin imports it into its backend (for verbs:
	// ibv_reg_dmabuf_mr); the SDK never maps it into the CPU's address space.
	MemoryDMABuf MemoryKind = 2
)

func (k MemoryKind) String() string {
	switch k {
	case MemoryHostShared:
		return "host-shared"
	case MemoryDMABuf:
		return "dmabuf"
	}
	return fmt.Sprintf("memory-kind(%d)", uint8(k))
}

// MemoryDesc describes memory the host shares with the plugin. Path is what
// the plugin opens to reach it: for memory created by NewSharedMemory it is
// /proc/<host pid>/fd/<fd>, which reopens the very same memfd (the plugin runs
// as the same user as the host, which the kernel requires for that path). A
// named /dev/shm file path works the same way.
type MemoryDesc struct {
	Kind   MemoryKind
	Path   string
	Offset uint64 // offset into the file where the region starts
	Size   uint64
	Device string // dma-buf only: the device that owns the memory (e.g. PCI bus id)
}

// OpKind is the kind of one-sided operation.
type OpKind uint8

const (
	// OpWrite copies local bytes into the remote exposure.
	OpWrite OpKind = 1
	// OpRead copies remote bytes into local memory (only if Capabilities.Read).
	OpRead OpKind = 2
)

// Op is one one-sided operation of a batch. RemoteOffset is relative to the
// start of the window that RemoteKey grants, not to the remote region.
type Op struct {
	Kind         OpKind
	LocalRegion  RegionID
	LocalOffset  uint64
	RemoteKey    Key
	RemoteOffset uint64
	Length       uint64
}

// Batch is the unit of Post and of completion: one call, one completion.
type Batch struct {
	ID   BatchID
	Peer PeerID
	Ops  []Op
}

// Bytes is the total length of the batch's operations.
func (b Batch) Bytes() uint64 {
	var n uint64
	for _, op := range b.Ops {
		n += op.Length
	}
	return n
}

// Status is the terminal status of a batch. There are three, and the third is
// the point of kvfence.
type Status uint8

const (
	// Succeeded: every byte of every operation landed AND no attempt of any
	// operation in the batch can still move. A backend that may still resend
	// a slice has not succeeded yet.
	Succeeded Status = 1
	// FailedDefinite: the transport PROVED that nothing more of the batch
	// will move (some bytes may have landed before that; see BytesLanded).
	FailedDefinite Status = 2
	// InDoubt: bytes of the batch may still move (timeouts, lost connections,
	// backend errors whose underlying writes may retry, a dead plugin). Only
	// Quiesce evidence resolves it. When unsure, a plugin must say InDoubt.
	InDoubt Status = 3
)

func (s Status) String() string {
	switch s {
	case Succeeded:
		return "Succeeded"
	case FailedDefinite:
		return "FailedDefinite"
	case InDoubt:
		return "InDoubt"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Completion is the one terminal report of a batch.
type Completion struct {
	Batch       BatchID
	Status      Status
	BytesLanded uint64        // bytes known (acknowledged) to have landed; a lower bound unless Succeeded
	Class       errdefs.Class // why, when not Succeeded
	Detail      string        // human detail, never parsed
}

// Evidence names why a Quiesce result holds: how the transport knows that
// none of the batches can still move bytes.
type Evidence string

const (
	// EvidenceCompletionsHarvested: every operation of every batch reached a
	// definite end (acknowledged, or provably rejected/flushed by the backend).
	EvidenceCompletionsHarvested Evidence = "completions-harvested"
	// EvidenceEndpointFlushed: the connection/queue pair was moved to an error
	// state and flushed, or destroyed, so nothing posted on it can move.
	EvidenceEndpointFlushed Evidence = "endpoint-flushed"
	// EvidenceReceiverConfirmed: the receiving side confirmed that it applies
	// nothing more from the torn-down connection.
	EvidenceReceiverConfirmed Evidence = "receiver-confirmed"
	// EvidenceReceiverClosed: the receiving end closed the connection that
	// carried the batches before the sender did — the sender read an
	// orderly end of stream (FIN) or a reset (RST) from it, and its own
	// kernel had not given up on the connection — so the receiving process,
	// which is the only reader of that connection and applies what it reads
	// straight into the target memory, can read and apply no more of it
	// (a closed socket's unread bytes are discarded by its kernel; a dead
	// process's sockets are closed by the kernel). It is what a sender
	// still has when the receiver is gone and cannot confirm anything.
	//
	// It holds only if (a) the receiving transport never closes a
	// connection while a byte it already read is still to be applied, and
	// never half-closes one it still reads; (b) the connection is end to
	// end: a TCP-terminating proxy that closes its side says nothing about
	// the receiver behind it; and (c) no middlebox forges FIN or RST
	// segments. A sender's own close, a timeout, or an unreachable peer is
	// never this evidence: the receiver may still be reading bytes that sit
	// in its socket buffer.
	EvidenceReceiverClosed Evidence = "receiver-closed"
	// EvidenceProcessExited: the plugin process was reaped; the kernel has
	// closed its sockets and destroyed its queue pairs. Emitted by the host.
	EvidenceProcessExited Evidence = "process-exited"
)

// QuiesceResult is Quiesce's evidence for the listed batches.
type QuiesceResult struct {
	Evidence Evidence
	Batches  []BatchID
	Detail   string
}

// Capabilities are what a transport declares about itself. They must be
// honest: the core derives its timeout bound from MaxTail.
type Capabilities struct {
	Revoke      bool          // implements Granter: receiver-side revocation
	Read        bool          // supports OpRead
	MaxTail     time.Duration // longest time bytes of a posted batch may still land after its completion or a failure was reported, absent Quiesce
	MaxBatch    int           // most operations in one batch
	MaxOpBytes  uint64        // most bytes in one operation
	MemoryKinds []MemoryKind
	// WriterBound: Grant honours Window.Writer, and the device itself then
	// refuses that key to every other writer (verbs: a type-2 memory window
	// bound on the writer's own queue pair).
	WriterBound bool
	// Bounds: how far the receiving side itself holds a write to the bytes
	// its key grants (bounds.go). A plugin that does not say (an older
	// one) is BoundsNone.
	Bounds Bounds
	// BatchKeys: implements KeyBatcher, many Grants or Revokes in one
	// call (batch_keys.go). Over gRPC the sdk declares it for every
	// plugin that grants (its server answers a batch with the plugin's
	// KeyBatcher, or with one Grant or Revoke per item); a host seeing an
	// older plugin without it calls Grant and Revoke once per key.
	BatchKeys bool
	// RefusalsIsolated: a write the receiving side refuses (a revoked key,
	// another writer's key, a key's bounds) ends its own batch refused and
	// nothing else: batches under other keys sharing its connection or
	// queue pair complete as they would have. A host may then revoke an
	// aborted request's keys while its writes still arrive (the agent does,
	// at the abort). verbs cannot claim it: on an RC queue pair a remote
	// access error moves the whole queue pair to the error state, failing
	// every write behind it. The conformance check
	// refused-write-fails-alone holds a plugin to it.
	RefusalsIsolated bool
}

// Info identifies a transport.
type Info struct {
	Name            string
	Version         string
	ProtocolVersion int
	Capabilities    Capabilities
}

// Endpoint is what a peer needs to Connect to this transport.
type Endpoint struct {
	Transport string
	Address   string
	Opaque    []byte
}

// Window is what Grant exposes: [Offset, Offset+Length) of Region.
//
// Writer, when set, names the only writer that may use the key: the
// Address of the writing transport's LocalEndpoint. It must already be
// connected to this transport, and the key lives no longer than that
// connection (see Granter: a transport binding keys to one connection
// refuses a writer connected several times; tcp binds to the writer's
// proven identity, and the key lives until its last connection closes).
// A transport without Capabilities.WriterBound ignores Writer; empty
// Writer: whoever holds the key.
//
// Stride and Piece, when Stride is set, make the window pieced: of
// [Offset, Offset+Length) only the bytes at window offset o with
// o % Stride < Piece may be written, and one write must fit in one piece
// (a rank's shard in every slot of a run, say). Only a transport with
// Capabilities.Bounds == BoundsPieces may be granted a pieced window; the
// sdk refuses one to any other (Unimplemented), on both sides of the
// plugin boundary, so a plugin that ignores the fields can never expose
// the whole span. Stride zero: every byte of the window (Piece is zero).
type Window struct {
	Region RegionID
	Offset uint64
	Length uint64
	Writer string
	Stride uint64
	Piece  uint64
}

// RevokeResult reports what the receiver did under a key.
type RevokeResult struct {
	WritesApplied uint64 // writes applied under the key before revocation
	WritesDropped uint64 // writes refused under the key (so far)
}
