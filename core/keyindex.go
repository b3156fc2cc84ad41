package core

import "hash/maphash"

// processSeed is random per process: see keyIndex.
var processSeed = maphash.Bytes(maphash.MakeSeed(), nil)

// keyIndex finds a request key's record: open addressing with linear
// probing over one flat array of 8-byte slots (a fingerprint of the key's
// hash and an entry number), at most three quarters full, and the entries
// (key, record) in a second array by number. A new key's lookup (every
// admission, every request a prefill rank opens) reads only the slots,
// eight to a cache line, and its insertion writes the same line: about one
// line of a 1–2 MB array at 100,000 keys, where (key, record) slots took
// one line of a 6 MB array and a Go map its header, a control word and a
// slot (the misses that made the core's per-request cost grow with the
// live set, docs/fence-cost.md). Entry numbers are reused last freed
// first, so a new key's entry is one that an ended key used moments ago,
// still in cache. Deletion shifts later slots back, so there are no
// tombstones and a probe never walks past its run.
//
// The fingerprint is the hash's high 32 bits with the top one set (0 marks
// an empty slot), and a key's home is its fingerprint's low bits: growth
// and deletion find any slot's home without reading its entry. Only a
// matching fingerprint reads the entry's key, and only an equal key is a
// match: fingerprints may collide (tests make them collide on purpose, see
// loose), keys decide.
//
// The hash is seeded per process (as Go's own maps are) and by the owner's
// instance or session, so that router-chosen rooms cannot be picked to
// collide. Nothing but the tests iterates an index, so the seed changes only
// where keys sit, never what the state machine does.
type keyIndex[V comparable] struct {
	ctrl    []uint8 // per slot: 0 empty, else ctrlOf its fingerprint
	slots   []keySlot
	entries []keyEntry[V]
	free    []uint32 // entry numbers to reuse, last freed on top
	n       int
	seed    uint64
	loose   uint32 // fingerprint bits cleared (tests only: forces collisions)
	// The slot of the key found last, or -1 (no slot yet: the zero value
	// is never read). An input looks its key up many times over (request,
	// streams, tombstones); this answers the repeats without hashing or
	// probing. Only del and grow move slots, and they forget it.
	memoKey   RequestKey
	memoSlot  int
	memoEntry uint32
}

// keySlot is one slot: fp 0 is empty.
type keySlot struct {
	fp, entry uint32
}

type keyEntry[V comparable] struct {
	key RequestKey
	val V
}

// fingerprint of k; never 0.
func (x *keyIndex[V]) fingerprint(k RequestKey) uint32 {
	return uint32(mix64(mix64(k.Room^x.seed)^k.Gen)>>32)&^x.loose | 1<<31
}

// locate returns k's slot and entry number and whether k is there; if
// not, the slot is the empty one where k would go (-1: no slots).
func (x *keyIndex[V]) locate(k RequestKey) (int, uint32, bool) {
	if x.memoSlot >= 0 && x.memoKey == k && len(x.ctrl) > 0 {
		return x.memoSlot, x.memoEntry, true
	}
	return x.find(k, x.fingerprint(k))
}

// find is locate without the remembered key. It reads only control bytes
// until one matches k's.
func (x *keyIndex[V]) find(k RequestKey, fp uint32) (int, uint32, bool) {
	if len(x.ctrl) == 0 {
		return -1, 0, false
	}
	mask := len(x.ctrl) - 1
	c := ctrlOf(fp)
	for i := int(fp) & mask; ; i = (i + 1) & mask {
		switch x.ctrl[i] {
		case 0:
			return i, 0, false
		case c:
			if s := x.slots[i]; s.fp == fp && x.entries[s.entry].key == k {
				x.memoKey, x.memoSlot, x.memoEntry = k, i, s.entry
				return i, s.entry, true
			}
		}
	}
}

// ctrlOf is a slot's control byte: 7 bits of fingerprint (above those that
// pick the home, in tables under 2^24 slots) and the top bit set (0 marks
// an empty slot).
func ctrlOf(fp uint32) uint8 { return uint8(fp>>24) | 0x80 }

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
	i, e, ok := x.locate(k)
	if ok {
		x.entries[e].val = v
		return
	}
	fp := x.fingerprint(k)
	if 8*(x.n+1) > 7*len(x.ctrl) {
		x.grow()
		i, _, _ = x.find(k, fp)
	}
	if n := len(x.free); n > 0 {
		e = x.free[n-1]
		x.free = x.free[:n-1]
		x.entries[e] = keyEntry[V]{key: k, val: v}
	} else {
		e = uint32(len(x.entries))
		x.entries = append(x.entries, keyEntry[V]{key: k, val: v})
	}
	x.ctrl[i], x.slots[i] = ctrlOf(fp), keySlot{fp: fp, entry: e}
	x.memoKey, x.memoSlot, x.memoEntry = k, i, e
	x.n++
}

// del forgets k, shifting the rest of its run back into the hole.
func (x *keyIndex[V]) del(k RequestKey) {
	i, e, ok := x.locate(k)
	if !ok {
		return
	}
	x.memoSlot = -1
	x.entries[e] = keyEntry[V]{}
	x.free = append(x.free, e)
	mask := len(x.ctrl) - 1
	for j := (i + 1) & mask; x.ctrl[j] != 0; j = (j + 1) & mask {
		// A slot may fill the hole at i unless its home lies
		// cyclically in (i, j]: then it must stay at or after its home.
		if h := int(x.slots[j].fp) & mask; (j-h)&mask >= (j-i)&mask {
			x.ctrl[i], x.slots[i] = x.ctrl[j], x.slots[j]
			i = j
		}
	}
	x.ctrl[i], x.slots[i] = 0, keySlot{}
	x.n--
}

func (x *keyIndex[V]) len() int { return x.n }

// grow doubles the slots; entries stay where they are.
func (x *keyIndex[V]) grow() {
	old := x.slots
	n := max(16, 2*len(old))
	x.ctrl, x.slots = make([]uint8, n), make([]keySlot, n)
	x.memoSlot = -1
	mask := n - 1
	for _, s := range old {
		if s.fp == 0 {
			continue
		}
		i := int(s.fp) & mask
		for x.ctrl[i] != 0 {
			i = (i + 1) & mask
		}
		x.ctrl[i], x.slots[i] = ctrlOf(s.fp), s
	}
}

// each calls f on every entry, in slot order (tests and inspection).
func (x *keyIndex[V]) each(f func(RequestKey, V)) {
	for _, s := range x.slots {
		if s.fp != 0 {
			e := &x.entries[s.entry]
			f(e.key, e.val)
		}
	}
}
