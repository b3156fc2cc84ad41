package core

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
)

// processSeed is random per process: see keyIndex.
var processSeed = maphash.Bytes(maphash.MakeSeed(), nil)

// keyIndex finds a request key's record: open addressing over groups of
// twelve slots, one group to a 64-byte cache line, at most three quarters
// full, and the entries (key, record) in a second array by number. A slot
// is a tag (8 bits of the key's hash; 0 marks an empty slot) and an entry
// number, and a group keeps its tags together and its entry numbers
// together. A key's home is a group; a lookup reads that group's twelve
// tags and goes on to the next group only if a key homed at or before it
// was placed past it (over), so a new key's lookup (every admission, every
// request a prefill rank opens) and its insertion touch one line: at
// 100,000 keys one line of a 1 MB array, where a control-byte array and a
// slot array took a line of each (128 KB and 1 MB), (key, record) slots a
// line of a 6 MB array, and a Go map its header, a control word and a slot
// (the misses that made the core's per-request cost grow with the live
// set, docs/fence-cost.md). Entry numbers are reused last freed first, so a
// new key's entry is one that an ended key used moments ago, still in
// cache. Deletion empties the slot and takes the key back out of the over
// counts it added, so there are no tombstones and a probe never walks past
// the groups a live key passed.
//
// A key's home is its hash's low bits and its tag the hash's top 8 bits
// (0 counts as 1). Only a matching tag reads the entry's key, and only an
// equal key is a match: tags collide often (1 in 255 per slot; tests make
// them collide on purpose, see loose), keys decide. Growth rehashes each
// entry's key.
//
// The hash is seeded per process (as Go's own maps are) and by the owner's
// instance or session, so that router-chosen rooms cannot be picked to
// collide. Nothing but the tests iterates an index, so the seed changes only
// where keys sit, never what the state machine does.
type keyIndex[V comparable] struct {
	groups  []keyGroup
	entries []keyEntry[V]
	free    []uint32 // entry numbers to reuse, last freed on top
	n       int
	seed    uint64
	loose   uint32 // hash bits cleared (tests only: forces collisions)
	// The position (group<<4 | lane) of the key found last, or -1 (none
	// yet: the zero value is never read). An input looks its key up many
	// times over (request, streams, tombstones); this answers the repeats
	// without hashing or probing. Only del and grow move or empty slots,
	// and they forget it.
	memoKey   RequestKey
	memoPos   int
	memoEntry uint32
}

// groupLanes is the number of slots in a group.
const groupLanes = 12

// keyGroup is one cache line of the index: twelve slots (tags, then entry
// numbers), and how many keys homed at an earlier group were placed past
// this one because it was full when they came (a lookup that misses here
// stops unless that is non-zero).
type keyGroup struct {
	tags    [groupLanes]uint8
	over    uint32
	entries [groupLanes]uint32
}

// matches marks the lanes whose tag is t: bit 8l+7 of word l/8 for lane
// l, by the zero-byte test on the tags xor t (eight lanes at a time). It
// may also mark a lane above a marked one whose tag is not t (a borrow):
// callers check the tag of every lane but the lowest marked.
func (g *keyGroup) matches(t uint8) [2]uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	b := ones * uint64(t)
	lo := binary.LittleEndian.Uint64(g.tags[:8]) ^ b
	hi := uint64(binary.LittleEndian.Uint32(g.tags[8:])) ^ b
	return [2]uint64{(lo - ones) &^ lo & highs, (hi - ones) &^ hi & highs & 0xffffffff}
}

type keyEntry[V comparable] struct {
	key RequestKey
	val V
}

// hash of k under the index's seed.
func (x *keyIndex[V]) hash(k RequestKey) uint32 {
	return uint32(mix64(mix64(k.Room^x.seed)^k.Gen)>>32) &^ x.loose
}

// tagOf is a slot's tag for hash h: never 0.
func tagOf(h uint32) uint8 {
	if t := uint8(h >> 24); t != 0 {
		return t
	}
	return 1
}

// locate returns k's position and entry number and whether k is there.
func (x *keyIndex[V]) locate(k RequestKey) (int, uint32, bool) {
	if x.memoPos >= 0 && x.memoKey == k && len(x.groups) > 0 {
		return x.memoPos, x.memoEntry, true
	}
	return x.find(k, x.hash(k))
}

// find is locate without the remembered key. It reads the entry of a
// slot only when the slot's tag is k's.
func (x *keyIndex[V]) find(k RequestKey, h uint32) (int, uint32, bool) {
	mask, t := len(x.groups)-1, tagOf(h)
	g := int(h) & mask
	for range x.groups {
		grp := &x.groups[g]
		for half, m := range grp.matches(t) {
			for ; m != 0; m &= m - 1 {
				l := half*8 + bits.TrailingZeros64(m)>>3
				if e := grp.entries[l]; grp.tags[l] == t && x.entries[e].key == k {
					pos := g<<4 | l
					x.memoKey, x.memoPos, x.memoEntry = k, pos, e
					return pos, e, true
				}
			}
		}
		if grp.over == 0 {
			break
		}
		g = (g + 1) & mask
	}
	return -1, 0, false
}

// get returns k's record, or the zero V.
func (x *keyIndex[V]) get(k RequestKey) V {
	if _, e, ok := x.locate(k); ok {
		return x.entries[e].val
	}
	var zero V
	return zero
}

// put sets k's record (v must not be the zero V).
func (x *keyIndex[V]) put(k RequestKey, v V) {
	_, e, ok := x.locate(k)
	if ok {
		x.entries[e].val = v
		return
	}
	if 4*(x.n+1) > 3*groupLanes*len(x.groups) {
		x.grow()
	}
	if n := len(x.free); n > 0 {
		e = x.free[n-1]
		x.free = x.free[:n-1]
		x.entries[e] = keyEntry[V]{key: k, val: v}
	} else {
		e = uint32(len(x.entries))
		x.entries = append(x.entries, keyEntry[V]{key: k, val: v})
	}
	x.memoKey, x.memoPos, x.memoEntry = k, x.place(x.hash(k), e), e
	x.n++
}

// place puts entry e, whose key hashes to h, in the first group from its
// home with a free slot, counting it in the over of every full group it
// passes, and returns its position. There is always a free slot: the
// index is at most three quarters full.
func (x *keyIndex[V]) place(h uint32, e uint32) int {
	mask := len(x.groups) - 1
	for g := int(h) & mask; ; g = (g + 1) & mask {
		grp := &x.groups[g]
		for half, m := range grp.matches(0) {
			if m != 0 {
				// The lowest lane the test marks is always an empty one.
				l := half*8 + bits.TrailingZeros64(m)>>3
				grp.tags[l], grp.entries[l] = tagOf(h), e
				return g<<4 | l
			}
		}
		grp.over++
	}
}

// del forgets k: its slot empties, and the groups it passed count it no
// longer.
func (x *keyIndex[V]) del(k RequestKey) {
	pos, e, ok := x.locate(k)
	if !ok {
		return
	}
	x.memoPos = -1
	x.entries[e] = keyEntry[V]{}
	x.free = append(x.free, e)
	g, mask := pos>>4, len(x.groups)-1
	for h := int(x.hash(k)) & mask; h != g; h = (h + 1) & mask {
		x.groups[h].over--
	}
	x.groups[g].tags[pos&15], x.groups[g].entries[pos&15] = 0, 0
	x.n--
}

func (x *keyIndex[V]) len() int { return x.n }

// grow doubles the groups; entries stay where they are.
func (x *keyIndex[V]) grow() {
	old := x.groups
	x.groups = make([]keyGroup, max(2, 2*len(old)))
	x.memoPos = -1
	for i := range old {
		for l, c := range old[i].tags {
			if c != 0 {
				e := old[i].entries[l]
				x.place(x.hash(x.entries[e].key), e)
			}
		}
	}
}

// each calls f on every entry, in slot order (tests and inspection).
func (x *keyIndex[V]) each(f func(RequestKey, V)) {
	for i := range x.groups {
		for l, c := range x.groups[i].tags {
			if c != 0 {
				e := &x.entries[x.groups[i].entries[l]]
				f(e.key, e.val)
			}
		}
	}
}
