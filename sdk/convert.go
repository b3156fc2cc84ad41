package sdk

import (
	"time"

	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
)

// Conversions between the contract's Go types and kvfence.transport.v1.
// Unknown enum values decode to zero values, which the transport then
// rejects as invalid arguments: the wire never smuggles in a new meaning.

func memoryKindToPB(k MemoryKind) pb.MemoryKind {
	switch k {
	case MemoryHostShared:
		return pb.MemoryKind_MEMORY_KIND_HOST_SHARED
	case MemoryDMABuf:
		return pb.MemoryKind_MEMORY_KIND_DMABUF
	}
	return pb.MemoryKind_MEMORY_KIND_UNSPECIFIED
}

func memoryKindFromPB(k pb.MemoryKind) MemoryKind {
	switch k {
	case pb.MemoryKind_MEMORY_KIND_HOST_SHARED:
		return MemoryHostShared
	case pb.MemoryKind_MEMORY_KIND_DMABUF:
		return MemoryDMABuf
	}
	return 0
}

func statusToPB(s Status) pb.Status {
	switch s {
	case Succeeded:
		return pb.Status_STATUS_SUCCEEDED
	case FailedDefinite:
		return pb.Status_STATUS_FAILED_DEFINITE
	case InDoubt:
		return pb.Status_STATUS_IN_DOUBT
	}
	return pb.Status_STATUS_UNSPECIFIED
}

// statusFromPB maps an unknown status to InDoubt: a status the host cannot
// read proves nothing.
func statusFromPB(s pb.Status) Status {
	switch s {
	case pb.Status_STATUS_SUCCEEDED:
		return Succeeded
	case pb.Status_STATUS_FAILED_DEFINITE:
		return FailedDefinite
	}
	return InDoubt
}

func infoToPB(i Info) *pb.InfoResponse {
	r := &pb.InfoResponse{
		Name:             i.Name,
		Version:          i.Version,
		ProtocolVersion:  uint32(i.ProtocolVersion),
		Revoke:           i.Capabilities.Revoke,
		Read:             i.Capabilities.Read,
		MaxTailNanos:     int64(i.Capabilities.MaxTail),
		MaxBatch:         uint32(i.Capabilities.MaxBatch),
		MaxOpBytes:       i.Capabilities.MaxOpBytes,
		WriterBound:      i.Capabilities.WriterBound,
		Bounds:           boundsToPB(i.Capabilities.Bounds),
		BatchKeys:        i.Capabilities.BatchKeys,
		RefusalsIsolated: i.Capabilities.RefusalsIsolated,
	}
	for _, k := range i.Capabilities.MemoryKinds {
		r.MemoryKinds = append(r.MemoryKinds, memoryKindToPB(k))
	}
	return r
}

func infoFromPB(r *pb.InfoResponse) Info {
	i := Info{
		Name:            r.GetName(),
		Version:         r.GetVersion(),
		ProtocolVersion: int(r.GetProtocolVersion()),
		Capabilities: Capabilities{
			Revoke:           r.GetRevoke(),
			Read:             r.GetRead(),
			MaxTail:          time.Duration(r.GetMaxTailNanos()),
			MaxBatch:         int(r.GetMaxBatch()),
			MaxOpBytes:       r.GetMaxOpBytes(),
			WriterBound:      r.GetWriterBound(),
			Bounds:           boundsFromPB(r.GetBounds()),
			BatchKeys:        r.GetBatchKeys(),
			RefusalsIsolated: r.GetRefusalsIsolated(),
		},
	}
	for _, k := range r.GetMemoryKinds() {
		i.Capabilities.MemoryKinds = append(i.Capabilities.MemoryKinds, memoryKindFromPB(k))
	}
	return i
}

func boundsToPB(b Bounds) pb.KeyBounds {
	switch b {
	case BoundsWindow:
		return pb.KeyBounds_KEY_BOUNDS_WINDOW
	case BoundsPieces:
		return pb.KeyBounds_KEY_BOUNDS_PIECES
	}
	return pb.KeyBounds_KEY_BOUNDS_NONE
}

// boundsFromPB reads an unknown value as none: a claim the host cannot
// read enforces nothing.
func boundsFromPB(b pb.KeyBounds) Bounds {
	switch b {
	case pb.KeyBounds_KEY_BOUNDS_WINDOW:
		return BoundsWindow
	case pb.KeyBounds_KEY_BOUNDS_PIECES:
		return BoundsPieces
	}
	return BoundsNone
}

func windowToPB(w Window) *pb.GrantRequest {
	return &pb.GrantRequest{Region: uint64(w.Region), Offset: w.Offset, Length: w.Length, Writer: w.Writer, Stride: w.Stride, Piece: w.Piece}
}

func windowFromPB(r *pb.GrantRequest) Window {
	return Window{Region: RegionID(r.GetRegion()), Offset: r.GetOffset(), Length: r.GetLength(), Writer: r.GetWriter(),
		Stride: r.GetStride(), Piece: r.GetPiece()}
}

func memoryDescToPB(d MemoryDesc) *pb.MemoryDesc {
	return &pb.MemoryDesc{Kind: memoryKindToPB(d.Kind), Path: d.Path, Offset: d.Offset, Size: d.Size, Device: d.Device}
}

func memoryDescFromPB(d *pb.MemoryDesc) MemoryDesc {
	return MemoryDesc{Kind: memoryKindFromPB(d.GetKind()), Path: d.GetPath(), Offset: d.GetOffset(), Size: d.GetSize(), Device: d.GetDevice()}
}

func endpointToPB(e Endpoint) *pb.Endpoint {
	return &pb.Endpoint{Transport: e.Transport, Address: e.Address, Opaque: e.Opaque}
}

func endpointFromPB(e *pb.Endpoint) Endpoint {
	return Endpoint{Transport: e.GetTransport(), Address: e.GetAddress(), Opaque: e.GetOpaque()}
}

func batchToPB(b Batch) *pb.PostRequest {
	r := &pb.PostRequest{Batch: uint64(b.ID), Peer: string(b.Peer), Ops: make([]*pb.Op, len(b.Ops))}
	for i, op := range b.Ops {
		kind := pb.OpKind_OP_KIND_UNSPECIFIED
		switch op.Kind {
		case OpWrite:
			kind = pb.OpKind_OP_KIND_WRITE
		case OpRead:
			kind = pb.OpKind_OP_KIND_READ
		}
		r.Ops[i] = &pb.Op{Kind: kind, LocalRegion: uint64(op.LocalRegion), LocalOffset: op.LocalOffset,
			RemoteKey: uint64(op.RemoteKey), RemoteOffset: op.RemoteOffset, Length: op.Length}
	}
	return r
}

func batchFromPB(r *pb.PostRequest) Batch {
	b := Batch{ID: BatchID(r.GetBatch()), Peer: PeerID(r.GetPeer()), Ops: make([]Op, len(r.GetOps()))}
	for i, op := range r.GetOps() {
		var kind OpKind
		switch op.GetKind() {
		case pb.OpKind_OP_KIND_WRITE:
			kind = OpWrite
		case pb.OpKind_OP_KIND_READ:
			kind = OpRead
		}
		b.Ops[i] = Op{Kind: kind, LocalRegion: RegionID(op.GetLocalRegion()), LocalOffset: op.GetLocalOffset(),
			RemoteKey: Key(op.GetRemoteKey()), RemoteOffset: op.GetRemoteOffset(), Length: op.GetLength()}
	}
	return b
}

func completionToPB(c Completion) *pb.Completion {
	return &pb.Completion{Batch: uint64(c.Batch), Status: statusToPB(c.Status), BytesLanded: c.BytesLanded,
		ErrorClass: uint32(c.Class), Detail: c.Detail}
}

func completionFromPB(c *pb.Completion) Completion {
	return Completion{Batch: BatchID(c.GetBatch()), Status: statusFromPB(c.GetStatus()), BytesLanded: c.GetBytesLanded(),
		Class: errdefs.Class(c.GetErrorClass()), Detail: c.GetDetail()}
}

func batchIDsToPB(ids []BatchID) []uint64 {
	out := make([]uint64, len(ids))
	for i, id := range ids {
		out[i] = uint64(id)
	}
	return out
}

func batchIDsFromPB(ids []uint64) []BatchID {
	out := make([]BatchID, len(ids))
	for i, id := range ids {
		out[i] = BatchID(id)
	}
	return out
}
