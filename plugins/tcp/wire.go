package tcp

import (
	"encoding/binary"
	"fmt"

	"github.com/kvfence/kvfence/sdk"
)

// The wire, inside a TLS 1.3 connection (identity.go): every frame starts
// with a fixed 48-byte little-endian header; only WRITE carries a payload
// (Length bytes) after it.
//
//	0  magic    u32  "KVFT"
//	4  version  u8   3
//	5  type     u8   frameType
//	6  code     u16  ACK / QUIESCED / HELLO_ACK result; WRITE: flags (writeAckNow); zero otherwise
//	8  seq      u64  WRITE/ACK: per-connection operation number
//	16 key      u64  WRITE, HELLO: exposure key; HELLO_ACK/QUIESCE: session token, first half
//	24 offset   u64  WRITE: offset in the key's window; HELLO_ACK/QUIESCE: session token, second half
//	32 length   u64  WRITE: payload length; ACK: bytes applied
//	40 deadline i64  WRITE: unix nanos (sender clock) after which it must not be applied
//
// A HELLO may name up to three more keys in seq, offset and deadline (zero:
// none; helloKeys): the receiver opens the session if any named key is
// usable there. A receiver that reads only key ignores them, and a sender
// that names one leaves them zero, so both ends need not agree on it.
//
// Version 1 was the same frames in cleartext, with a receiver instance and
// sequential session ids where the token is now. Version 2's HELLO named
// no key: any client that completed a handshake got a session
// (admission.go). Version 3's receiver acknowledged each write of 32 KiB
// and more in a record of its own; a version 4 sender says which writes
// want their acknowledgements sent at once (writeAckNow, acks.go).
const (
	headerSize   = 48
	wireMagic    = 0x5446564b // "KVFT" little-endian
	wireVersion  = 4
	maxWireBytes = 1 << 30 // hard cap on one write's payload, whatever the config says
)

type frameType uint8

const (
	frameHello    frameType = 1 // sender → receiver: first frame of a data connection
	frameHelloAck frameType = 2 // receiver → sender: the session's token
	frameWrite    frameType = 3 // sender → receiver: one write, payload follows
	frameAck      frameType = 4 // receiver → sender: result of one write
	frameQuiesce  frameType = 5 // sender → receiver on a second connection, same identity
	frameQuiesced frameType = 6 // receiver → sender: the session applies nothing more
)

// writeAckNow, in a WRITE's code: the sender has nothing more queued
// behind this write (it ends a batch), so the receiver sends the
// acknowledgements it holds, this one's included, at once (acks.go).
const writeAckNow = 1

// ackCode is the receiver's verdict on one write. Every non-OK code means the
// receiver applied none of the write's bytes.
type ackCode uint16

const (
	ackOK          ackCode = 0
	ackUnknownKey  ackCode = 1
	ackRevoked     ackCode = 2
	ackOutOfBounds ackCode = 3
	ackExpired     ackCode = 4
	ackNotWriter   ackCode = 5 // the key is bound to another writer's connection
)

// quiesced codes.
const (
	quiescedOK = 0
	// quiescedRefused: the session exists but belongs to another identity.
	quiescedRefused = 1
)

type header struct {
	Type     frameType
	Code     uint16
	Seq      uint64
	Key      uint64
	Offset   uint64
	Length   uint64
	Deadline int64
}

// setToken and token carry a session token in Key and Offset.
func (h *header) setToken(t sessionToken) {
	h.Key = binary.LittleEndian.Uint64(t[:8])
	h.Offset = binary.LittleEndian.Uint64(t[8:])
}

func (h *header) token() sessionToken {
	var t sessionToken
	binary.LittleEndian.PutUint64(t[:8], h.Key)
	binary.LittleEndian.PutUint64(t[8:], h.Offset)
	return t
}

func (h *header) encode(b []byte) {
	_ = b[headerSize-1]
	binary.LittleEndian.PutUint32(b[0:], wireMagic)
	b[4] = wireVersion
	b[5] = byte(h.Type)
	binary.LittleEndian.PutUint16(b[6:], h.Code)
	binary.LittleEndian.PutUint64(b[8:], h.Seq)
	binary.LittleEndian.PutUint64(b[16:], h.Key)
	binary.LittleEndian.PutUint64(b[24:], h.Offset)
	binary.LittleEndian.PutUint64(b[32:], h.Length)
	binary.LittleEndian.PutUint64(b[40:], uint64(h.Deadline))
}

// encodeTo appends the encoded header to b.
func (h *header) encodeTo(b []byte) []byte {
	var hb [headerSize]byte
	h.encode(hb[:])
	return append(b, hb[:]...)
}

// wireError is a malformed frame: the connection cannot be resynchronised
// and is closed; the process stays up.
type wireError struct{ msg string }

func (e *wireError) Error() string { return "tcp wire: " + e.msg }

func wireErrorf(format string, args ...any) error {
	return &wireError{msg: fmt.Sprintf(format, args...)}
}

// decodeHeader parses and validates a header from an untrusted peer.
// maxWrite bounds a WRITE's payload (so a peer cannot make us read forever
// into a window); it is capped at maxWireBytes.
func decodeHeader(b []byte, maxWrite uint64) (header, error) {
	var h header
	if len(b) < headerSize {
		return h, wireErrorf("short header: %d bytes", len(b))
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != wireMagic {
		return h, wireErrorf("bad magic %#x", m)
	}
	if v := b[4]; v != wireVersion {
		return h, wireErrorf("unsupported version %d", v)
	}
	h.Type = frameType(b[5])
	h.Code = binary.LittleEndian.Uint16(b[6:])
	h.Seq = binary.LittleEndian.Uint64(b[8:])
	h.Key = binary.LittleEndian.Uint64(b[16:])
	h.Offset = binary.LittleEndian.Uint64(b[24:])
	h.Length = binary.LittleEndian.Uint64(b[32:])
	h.Deadline = int64(binary.LittleEndian.Uint64(b[40:]))
	if maxWrite == 0 || maxWrite > maxWireBytes {
		maxWrite = maxWireBytes
	}
	return h, checkHeader(h, maxWrite)
}

// helloKeys are the keys a HELLO names, zeros left out.
func (h header) helloKeys() []uint64 {
	var keys []uint64
	for _, k := range [...]uint64{h.Key, h.Seq, h.Offset, uint64(h.Deadline)} {
		if k != 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

// setHelloKeys names keys[:4] in a HELLO.
func (h *header) setHelloKeys(keys []sdk.Key) {
	var k [4]uint64
	for i := range min(len(keys), len(k)) {
		k[i] = uint64(keys[i])
	}
	h.Key, h.Seq, h.Offset, h.Deadline = k[0], k[1], k[2], int64(k[3])
}

// checkHeader checks what each frame type allows in its code and length.
func checkHeader(h header, maxWrite uint64) error {
	switch h.Type {
	case frameWrite:
		if h.Code&^writeAckNow != 0 {
			return wireErrorf("write with code %d", h.Code)
		}
		if h.Length == 0 {
			return wireErrorf("zero-length write")
		}
		if h.Length > maxWrite {
			return wireErrorf("write of %d bytes exceeds %d", h.Length, maxWrite)
		}
		if h.Deadline <= 0 {
			return wireErrorf("write without deadline")
		}
	case frameAck:
		if h.Code > uint16(ackNotWriter) {
			return wireErrorf("unknown ack code %d", h.Code)
		}
	case frameQuiesced:
		if h.Code > quiescedRefused {
			return wireErrorf("unknown quiesced code %d", h.Code)
		}
	case frameHelloAck:
		if h.Code > helloRefused || h.Length != 0 {
			return wireErrorf("hello ack with code %d, length %d", h.Code, h.Length)
		}
	case frameHello, frameQuiesce:
		if h.Code != 0 || h.Length != 0 {
			return wireErrorf("frame type %d with code/length set", h.Type)
		}
	default:
		return wireErrorf("unknown frame type %d", h.Type)
	}
	return nil
}
