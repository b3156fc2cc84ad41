package main

import (
	"encoding/binary"
	"io"

	"github.com/kvfence/kvfence/errdefs"
)

// A frame header: magic, key, offset in the window, length, deadline (Unix
// nanoseconds). The payload follows; the target answers one byte.
const (
	frameMagic  = 0x6b76666d // "kvfm"
	headerBytes = 4 + 8*4
)

const (
	replyApplied   = 0
	replyRevoked   = 1 // the key was revoked
	replyExpired   = 2 // past its deadline: not applied
	replyUnknown   = 3 // no such key: no longer sent (unknown keys get replyRevoked), still understood
	replyOutWindow = 4 // outside the key's window
)

// refusalClass is the class a refusal carries to the initiator: the
// conformance suite checks it (remote-refusals).
var refusalClass = map[byte]errdefs.Class{
	replyRevoked:   errdefs.FailedPrecondition,
	replyExpired:   errdefs.Unavailable,
	replyUnknown:   errdefs.NotFound,
	replyOutWindow: errdefs.InvalidArgument,
}

type header struct {
	key, off, n uint64
	deadline    int64
}

func (h header) put(b []byte) {
	binary.LittleEndian.PutUint32(b, frameMagic)
	binary.LittleEndian.PutUint64(b[4:], h.key)
	binary.LittleEndian.PutUint64(b[12:], h.off)
	binary.LittleEndian.PutUint64(b[20:], h.n)
	binary.LittleEndian.PutUint64(b[28:], uint64(h.deadline))
}

// readHeader reads one header; ok=false on a bad magic (a corrupted
// stream: the connection is closed).
func readHeader(r io.Reader) (h header, ok bool, err error) {
	var b [headerBytes]byte
	if _, err = io.ReadFull(r, b[:]); err != nil {
		return h, false, err
	}
	if binary.LittleEndian.Uint32(b[:]) != frameMagic {
		return h, false, nil
	}
	h.key = binary.LittleEndian.Uint64(b[4:])
	h.off = binary.LittleEndian.Uint64(b[12:])
	h.n = binary.LittleEndian.Uint64(b[20:])
	h.deadline = int64(binary.LittleEndian.Uint64(b[28:]))
	return h, true, nil
}
