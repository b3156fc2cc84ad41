package sdk

import (
	"encoding/binary"
	"strings"
	"unicode/utf8"

	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvfence/kvfence/errdefs"
)

// The ring records of a Post and of a Completion are protobuf messages
// (pb.PostRequest, pb.Completion), as they always were: a host or plugin
// built with an older SDK reads and writes them with proto.Marshal and
// proto.Unmarshal. Here they are written and read by hand, field by field
// with protowire, without reflection and without allocating a message per
// record (every batch crosses the boundary twice: its Post and its
// Completion). The encoders write what proto.Marshal writes (fields in
// number order, proto3 zero values left out); the decoders read the
// fields in any order and fall back to proto.Unmarshal for anything else
// (an unknown field, another wire type, a string that is not UTF-8), so a
// record decodes, or fails to, exactly as it did with proto.Unmarshal.

// Field numbers of the two messages (transport.proto).
const (
	fPostBatch = 1
	fPostPeer  = 2
	fPostOps   = 3

	fOpKind         = 1
	fOpLocalRegion  = 2
	fOpLocalOffset  = 3
	fOpRemoteKey    = 4
	fOpRemoteOffset = 5
	fOpLength       = 6

	fCompBatch       = 1
	fCompStatus      = 2
	fCompBytesLanded = 3
	fCompErrorClass  = 4
	fCompDetail      = 5
)

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func opKindToWire(k OpKind) uint64 {
	switch k {
	case OpWrite:
		return uint64(pb.OpKind_OP_KIND_WRITE)
	case OpRead:
		return uint64(pb.OpKind_OP_KIND_READ)
	}
	return uint64(pb.OpKind_OP_KIND_UNSPECIFIED)
}

func opKindFromWire(v uint64) OpKind {
	switch pb.OpKind(int32(v)) { // an enum is an int32, as proto.Unmarshal reads it
	case pb.OpKind_OP_KIND_WRITE:
		return OpWrite
	case pb.OpKind_OP_KIND_READ:
		return OpRead
	}
	return 0
}

// appendPostRecord appends b as a pb.PostRequest (batchToPB's message).
// ok is false where proto.Marshal fails too: a peer that is not UTF-8.
func appendPostRecord(dst []byte, b Batch) (_ []byte, ok bool) {
	if !utf8.ValidString(string(b.Peer)) {
		return dst, false
	}
	dst = appendVarintField(dst, fPostBatch, uint64(b.ID))
	dst = appendStringField(dst, fPostPeer, string(b.Peer))
	for _, op := range b.Ops {
		var o [6 * (1 + binary.MaxVarintLen64)]byte // six fields, each a tag byte and a varint
		m := appendVarintField(o[:0], fOpKind, opKindToWire(op.Kind))
		m = appendVarintField(m, fOpLocalRegion, uint64(op.LocalRegion))
		m = appendVarintField(m, fOpLocalOffset, op.LocalOffset)
		m = appendVarintField(m, fOpRemoteKey, uint64(op.RemoteKey))
		m = appendVarintField(m, fOpRemoteOffset, op.RemoteOffset)
		m = appendVarintField(m, fOpLength, op.Length)
		dst = protowire.AppendTag(dst, fPostOps, protowire.BytesType)
		dst = protowire.AppendBytes(dst, m)
	}
	return dst, true
}

// decodePostRecord reads a Post record as proto.Unmarshal and batchFromPB
// would.
func decodePostRecord(rec []byte) (Batch, error) {
	if b, ok := decodePostFast(rec); ok {
		return b, nil
	}
	var req pb.PostRequest
	if err := proto.Unmarshal(rec, &req); err != nil {
		return Batch{}, err
	}
	return batchFromPB(&req), nil
}

func decodePostFast(rec []byte) (b Batch, ok bool) {
	nops := 0
	for pass := 0; pass < 2; pass++ { // count the ops, then read them into one slice
		if pass == 1 {
			b.Ops = make([]Op, 0, nops)
		}
		for r := rec; len(r) > 0; {
			num, typ, n := protowire.ConsumeTag(r)
			if n < 0 {
				return Batch{}, false
			}
			r = r[n:]
			switch {
			case num == fPostBatch && typ == protowire.VarintType:
				v, n := protowire.ConsumeVarint(r)
				if n < 0 {
					return Batch{}, false
				}
				b.ID, r = BatchID(v), r[n:]
			case num == fPostPeer && typ == protowire.BytesType:
				v, n := protowire.ConsumeBytes(r)
				if n < 0 || !utf8.Valid(v) {
					return Batch{}, false
				}
				if pass == 1 {
					b.Peer = PeerID(v)
				}
				r = r[n:]
			case num == fPostOps && typ == protowire.BytesType:
				v, n := protowire.ConsumeBytes(r)
				if n < 0 {
					return Batch{}, false
				}
				r = r[n:]
				if pass == 0 {
					nops++
					continue
				}
				op, ok := decodeOpFast(v)
				if !ok {
					return Batch{}, false
				}
				b.Ops = append(b.Ops, op)
			default:
				return Batch{}, false
			}
		}
	}
	return b, true
}

func decodeOpFast(r []byte) (op Op, ok bool) {
	for len(r) > 0 {
		num, typ, n := protowire.ConsumeTag(r)
		if n < 0 || typ != protowire.VarintType {
			return Op{}, false
		}
		r = r[n:]
		v, n := protowire.ConsumeVarint(r)
		if n < 0 {
			return Op{}, false
		}
		r = r[n:]
		switch num {
		case fOpKind:
			op.Kind = opKindFromWire(v)
		case fOpLocalRegion:
			op.LocalRegion = RegionID(v)
		case fOpLocalOffset:
			op.LocalOffset = v
		case fOpRemoteKey:
			op.RemoteKey = Key(v)
		case fOpRemoteOffset:
			op.RemoteOffset = v
		case fOpLength:
			op.Length = v
		default:
			return Op{}, false
		}
	}
	return op, true
}

// appendCompletionRecord appends c as a pb.Completion (completionToPB's
// message). A detail that is not UTF-8 (one cut short by truncateDetail
// inside a character, or a library's raw bytes) is made valid: proto.Marshal
// refuses it, and the completion must cross whatever its detail says.
func appendCompletionRecord(dst []byte, c Completion) []byte {
	detail := c.Detail
	if !utf8.ValidString(detail) {
		detail = strings.ToValidUTF8(detail, "\uFFFD")
	}
	dst = appendVarintField(dst, fCompBatch, uint64(c.Batch))
	dst = appendVarintField(dst, fCompStatus, uint64(statusToPB(c.Status)))
	dst = appendVarintField(dst, fCompBytesLanded, c.BytesLanded)
	dst = appendVarintField(dst, fCompErrorClass, uint64(uint32(c.Class)))
	return appendStringField(dst, fCompDetail, detail)
}

// decodeCompletionRecord reads a completion (or a refusal's) record as
// proto.Unmarshal and completionFromPB would; class is the error class as
// the wire has it (Completion.Class keeps its low byte, and a refusal's
// class outside the vocabulary is the plugin's bug: refusalClass).
func decodeCompletionRecord(rec []byte) (_ Completion, class uint32, _ error) {
	if c, class, ok := decodeCompletionFast(rec); ok {
		return c, class, nil
	}
	var m pb.Completion
	if err := proto.Unmarshal(rec, &m); err != nil {
		return Completion{}, 0, err
	}
	return completionFromPB(&m), m.GetErrorClass(), nil
}

func decodeCompletionFast(r []byte) (c Completion, class uint32, ok bool) {
	c.Status = statusFromPB(pb.Status_STATUS_UNSPECIFIED)
	for len(r) > 0 {
		num, typ, n := protowire.ConsumeTag(r)
		if n < 0 {
			return Completion{}, 0, false
		}
		r = r[n:]
		switch {
		case num == fCompDetail && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(r)
			if n < 0 || !utf8.Valid(v) {
				return Completion{}, 0, false
			}
			c.Detail, r = string(v), r[n:]
			continue
		case typ != protowire.VarintType:
			return Completion{}, 0, false
		}
		v, n := protowire.ConsumeVarint(r)
		if n < 0 {
			return Completion{}, 0, false
		}
		r = r[n:]
		switch num {
		case fCompBatch:
			c.Batch = BatchID(v)
		case fCompStatus:
			c.Status = statusFromPB(pb.Status(int32(v)))
		case fCompBytesLanded:
			c.BytesLanded = v
		case fCompErrorClass:
			class = uint32(v)
			c.Class = errdefs.Class(class)
		default:
			return Completion{}, 0, false
		}
	}
	return c, class, true
}
