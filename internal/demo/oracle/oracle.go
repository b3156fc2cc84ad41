package oracle

import (
	"encoding/binary"
	"fmt"

	"github.com/kvfence/kvfence/core"
)

const (
	oracleMagic = 0x6b76666e // "kvfn"
	HeaderBytes = 32         // magic, rank, page, room, gen
)

// PageIdentity is whose bytes a shard holds.
type PageIdentity struct {
	Room, Gen uint64
	Page      uint32
	Rank      uint32
}

// FillShard writes the oracle content of (id) into dst.
func FillShard(dst []byte, id PageIdentity) {
	if len(dst) < HeaderBytes {
		panic("oracle: shard smaller than the oracle header")
	}
	binary.LittleEndian.PutUint32(dst[0:], oracleMagic)
	binary.LittleEndian.PutUint32(dst[4:], id.Rank)
	binary.LittleEndian.PutUint64(dst[8:], uint64(id.Page))
	binary.LittleEndian.PutUint64(dst[16:], id.Room)
	binary.LittleEndian.PutUint64(dst[24:], id.Gen)
	x := seed(id)
	body := dst[HeaderBytes:]
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
	body := src[HeaderBytes:]
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
	if len(src) < HeaderBytes || binary.LittleEndian.Uint32(src) != oracleMagic {
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

// Check is the oracle as the runtime's content check (agent.ContentCheck):
// decode calls it before exposing slots, at handoff, at finish and after
// release.
type Check struct{}

// Free reports whose bytes a free shard holds ("" if none): any identity
// there was written while the memory was free (I1).
func (Check) Free(shard []byte) string {
	if owner := ReadIdentity(shard); owner != (PageIdentity{}) {
		return owner.String()
	}
	return ""
}

// Owned reports whether shard holds exactly page's content written by rank
// for tag, and if not, whose bytes it holds.
func (Check) Owned(shard []byte, tag core.Tag, page int, rank core.RankID) (bool, string) {
	ok, owner := VerifyShard(shard, PageIdentity{Room: tag.Room, Gen: tag.Gen, Page: uint32(page), Rank: uint32(rank)})
	return ok, owner.String()
}

// Released clears a released shard's header, so that a late write landing
// while the memory is free is seen by Free at the next exposure.
func (Check) Released(shard []byte) {
	if len(shard) >= HeaderBytes {
		clear(shard[:HeaderBytes])
	}
}

// String names whose bytes these are ("none" for an unwritten shard).
func (id PageIdentity) String() string {
	if id == (PageIdentity{}) {
		return "none"
	}
	return fmt.Sprintf("room %d gen %d page %d rank %d", id.Room, id.Gen, id.Page, id.Rank)
}
