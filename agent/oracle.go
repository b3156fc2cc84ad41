package agent

import (
	"encoding/binary"
)

// The content oracle: every shard a prefill rank writes for a request is a
// pure function of (room, gen, page, rank). Decode recomputes it at handoff
// and again when the decode loop finishes, so a page that holds another
// request's bytes (a late write that landed after reuse) is detected, and its
// header says whose bytes they are.

const (
	oracleMagic  = 0x6b76666e // "kvfn"
	oracleHeader = 32         // magic, rank, page, room, gen
)

// PageIdentity is whose bytes a shard holds.
type PageIdentity struct {
	Room, Gen uint64
	Page      uint32
	Rank      uint32
}

// FillShard writes the oracle content of (id) into dst.
func FillShard(dst []byte, id PageIdentity) {
	if len(dst) < oracleHeader {
		panic("agent: shard smaller than the oracle header")
	}
	binary.LittleEndian.PutUint32(dst[0:], oracleMagic)
	binary.LittleEndian.PutUint32(dst[4:], id.Rank)
	binary.LittleEndian.PutUint64(dst[8:], uint64(id.Page))
	binary.LittleEndian.PutUint64(dst[16:], id.Room)
	binary.LittleEndian.PutUint64(dst[24:], id.Gen)
	x := seed(id)
	body := dst[oracleHeader:]
	for i := 0; i+8 <= len(body); i += 8 {
		x = next(x)
		binary.LittleEndian.PutUint64(body[i:], x)
	}
	for i := len(body) &^ 7; i < len(body); i++ {
		body[i] = byte(x >> (8 * (i & 7)))
	}
}

// VerifyShard reports whether src holds exactly the content of want. When it
// does not, owner is whose header it carries (zero if none: never written).
func VerifyShard(src []byte, want PageIdentity) (ok bool, owner PageIdentity) {
	owner = ReadIdentity(src)
	if owner != want {
		return false, owner
	}
	x := seed(want)
	body := src[oracleHeader:]
	for i := 0; i+8 <= len(body); i += 8 {
		x = next(x)
		if binary.LittleEndian.Uint64(body[i:]) != x {
			return false, owner // torn: two writers interleaved
		}
	}
	for i := len(body) &^ 7; i < len(body); i++ {
		if body[i] != byte(x>>(8*(i&7))) {
			return false, owner
		}
	}
	return true, owner
}

// ReadIdentity decodes a shard's header (zero when it carries none).
func ReadIdentity(src []byte) PageIdentity {
	if len(src) < oracleHeader || binary.LittleEndian.Uint32(src) != oracleMagic {
		return PageIdentity{}
	}
	return PageIdentity{
		Rank: binary.LittleEndian.Uint32(src[4:]),
		Page: uint32(binary.LittleEndian.Uint64(src[8:])),
		Room: binary.LittleEndian.Uint64(src[16:]),
		Gen:  binary.LittleEndian.Uint64(src[24:]),
	}
}

func seed(id PageIdentity) uint64 {
	x := id.Room*0x9e3779b97f4a7c15 ^ id.Gen*0xbf58476d1ce4e5b9 ^ uint64(id.Page)<<32 ^ uint64(id.Rank)
	return x | 1
}

// next is xorshift64*: cheap, and different for every identity.
func next(x uint64) uint64 {
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	return x * 2685821657736338717
}
