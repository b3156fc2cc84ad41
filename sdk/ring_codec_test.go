package sdk

import (
	"bytes"
	"math"
	"reflect"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

var codecBatches = []Batch{
	{},
	{ID: 1},
	{ID: 7, Peer: "peer-1", Ops: []Op{{Kind: OpWrite, LocalRegion: 1, LocalOffset: 4096, RemoteKey: 99, RemoteOffset: 8192, Length: 65536}}},
	{ID: math.MaxUint64, Peer: "π", Ops: []Op{
		{Kind: OpRead, LocalRegion: math.MaxUint64, LocalOffset: math.MaxUint64, RemoteKey: math.MaxUint64, RemoteOffset: math.MaxUint64, Length: math.MaxUint64},
		{}, // every field zero: an empty Op message
		{Kind: OpKind(77), Length: 1},
	}},
}

var codecCompletions = []Completion{
	{},
	{Batch: 3, Status: Succeeded, BytesLanded: 65536},
	{Batch: math.MaxUint64, Status: FailedDefinite, Class: errdefs.Unavailable, Detail: "refused: π"},
	{Batch: 9, Status: InDoubt, BytesLanded: math.MaxUint64, Class: errdefs.Class(math.MaxUint8), Detail: "x"},
	{Batch: 10, Status: Status(42)},
}

// The hand-written records are what proto.Marshal writes for the messages
// they stand for, byte for byte: a peer built with an older SDK reads them
// with proto.Unmarshal.
func TestRingRecordsAreProtoMarshal(t *testing.T) {
	for _, b := range codecBatches {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(batchToPB(b))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := appendPostRecord([]byte("prefix"), b)
		if !ok || !bytes.Equal(got[len("prefix"):], want) {
			t.Errorf("Post record of %+v:\n got %x (ok %v)\nwant %x", b, got, ok, want)
		}
	}
	for _, c := range codecCompletions {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(completionToPB(c))
		if err != nil {
			t.Fatal(err)
		}
		if got := appendCompletionRecord(nil, c); !bytes.Equal(got, want) {
			t.Errorf("Completion record of %+v:\n got %x\nwant %x", c, got, want)
		}
	}
}

// A peer that is not UTF-8 is refused as proto.Marshal refuses it (the
// Post then never enters the ring); a detail that is not UTF-8 is repaired,
// so the completion still crosses.
func TestRingRecordsInvalidUTF8(t *testing.T) {
	if _, ok := appendPostRecord(nil, Batch{ID: 1, Peer: "\xff"}); ok {
		t.Error("a Post record with a peer that is not UTF-8 was written")
	}
	if _, err := proto.Marshal(batchToPB(Batch{ID: 1, Peer: "\xff"})); err == nil {
		t.Error("proto.Marshal took a peer that is not UTF-8: the refusal above no longer matches it")
	}
	cut := truncateDetail(string(bytes.Repeat([]byte("é"), maxRingDetail))) // cut inside a character
	rec := appendCompletionRecord(nil, Completion{Batch: 5, Status: InDoubt, Detail: cut})
	var m pb.Completion
	if err := proto.Unmarshal(rec, &m); err != nil {
		t.Fatalf("a completion with a truncated detail does not decode: %v", err)
	}
	if m.GetBatch() != 5 || m.GetStatus() != pb.Status_STATUS_IN_DOUBT || len(m.GetDetail()) < maxRingDetail-2 {
		t.Errorf("decoded %v", &m)
	}
}

// The decoders agree with proto.Unmarshal (and the conversions) on every
// input: records as written, fields in another order or repeated, unknown
// fields, other wire types, truncated records and strings that are not
// UTF-8.
func TestRingRecordDecodersAgreeWithProto(t *testing.T) {
	for _, rec := range codecInputs() {
		checkDecoders(t, rec)
	}
}

func FuzzRingRecordDecoders(f *testing.F) {
	for _, rec := range codecInputs() {
		f.Add(rec)
	}
	f.Fuzz(func(t *testing.T, rec []byte) { checkDecoders(t, rec) })
}

func checkDecoders(t *testing.T, rec []byte) {
	t.Helper()
	var req pb.PostRequest
	errRef := proto.Unmarshal(rec, &req)
	b, err := decodePostRecord(rec)
	if (err == nil) != (errRef == nil) {
		t.Fatalf("Post record %x: error %v, proto.Unmarshal's %v", rec, err, errRef)
	}
	if err == nil && !reflect.DeepEqual(b, batchFromPB(&req)) {
		t.Fatalf("Post record %x: decoded %+v, proto.Unmarshal's %+v", rec, b, batchFromPB(&req))
	}
	var m pb.Completion
	errRef = proto.Unmarshal(rec, &m)
	c, class, err := decodeCompletionRecord(rec)
	if (err == nil) != (errRef == nil) {
		t.Fatalf("Completion record %x: error %v, proto.Unmarshal's %v", rec, err, errRef)
	}
	if err == nil && class != m.GetErrorClass() {
		t.Fatalf("Completion record %x: error class %d, proto.Unmarshal's %d", rec, class, m.GetErrorClass())
	}
	if err == nil && c != completionFromPB(&m) {
		t.Fatalf("Completion record %x: decoded %+v, proto.Unmarshal's %+v", rec, c, completionFromPB(&m))
	}
}

func codecInputs() [][]byte {
	var ins [][]byte
	for _, b := range codecBatches {
		rec, _ := appendPostRecord(nil, b)
		ins = append(ins, rec)
		for i := 1; i < len(rec); i += 3 {
			ins = append(ins, rec[:i]) // truncated
		}
	}
	for _, c := range codecCompletions {
		rec := appendCompletionRecord(nil, c)
		ins = append(ins, rec)
		for i := 1; i < len(rec); i += 2 {
			ins = append(ins, rec[:i])
		}
	}
	v := func(b []byte, num protowire.Number, x uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), x)
	}
	s := func(b []byte, num protowire.Number, x string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), x)
	}
	op := s(nil, 3, string(v(v(nil, 6, 10), 1, 1))) // fields in reverse order
	ins = append(ins,
		v(s(nil, 2, "p"), 1, 4),                           // reverse order
		v(v(nil, 1, 4), 1, 5),                             // repeated scalar: the last wins
		s(s(nil, 2, "a"), 2, "b"),                         // repeated string
		append(op, op...),                                 // two ops
		v(nil, 9, 1),                                      // unknown varint field
		s(v(nil, 1, 4), 9, "unknown"),                     // unknown bytes field
		s(nil, 1, "batch as bytes"),                       // another wire type
		s(nil, 2, "\xff"),                                 // peer not UTF-8
		s(nil, 5, "\xc3"),                                 // detail not UTF-8
		s(nil, 3, string(s(nil, 1, "kind"))),              // op field with another wire type
		s(nil, 3, string(v(nil, 9, 1))),                   // unknown op field
		s(nil, 3, "\x08"),                                 // op cut short
		v(nil, 2, math.MaxUint64),                         // enum values that do not fit an int32
		v(nil, 4, math.MaxUint64),                         // error class beyond 32 bits
		protowire.AppendTag(nil, 0, protowire.VarintType), // field number 0
		[]byte{0x0b, 0x0c},                                // a group
		[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // overlong tag
	)
	return ins
}

// BenchmarkRingRecords: one batch's two records (its Post and its
// Completion) written and read, by hand and with proto.
func BenchmarkRingRecords(b *testing.B) {
	batch := Batch{ID: 12345, Peer: "peer-7", Ops: []Op{{Kind: OpWrite, LocalRegion: 3, LocalOffset: 1 << 20, RemoteKey: 0x1234567890abcdef, RemoteOffset: 1 << 20, Length: 64 << 10}}}
	comp := Completion{Batch: 12345, Status: Succeeded, BytesLanded: 64 << 10}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for i := 0; i < b.N; i++ {
			buf, _ = appendPostRecord(buf[:0], batch)
			if _, err := decodePostRecord(buf); err != nil {
				b.Fatal(err)
			}
			buf = appendCompletionRecord(buf[:0], comp)
			if _, _, err := decodeCompletionRecord(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf, _ := proto.Marshal(batchToPB(batch))
			var req pb.PostRequest
			if err := proto.Unmarshal(buf, &req); err != nil {
				b.Fatal(err)
			}
			_ = batchFromPB(&req)
			buf, _ = proto.Marshal(completionToPB(comp))
			var m pb.Completion
			if err := proto.Unmarshal(buf, &m); err != nil {
				b.Fatal(err)
			}
			_ = completionFromPB(&m)
		}
	})
}
