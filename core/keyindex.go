package core

import "hash/maphash"

// processSeed is random per process: see keyIndex.
var processSeed = maphash.Bytes(maphash.MakeSeed(), nil)

// keyIndex finds a request key's record: open addressing with linear
// probing over one flat array of (key, record) slots, at most half full.
// A lookup of a new key among 100,000 touches about one cache line, where a
// Go map touches its table's header, a control word and a slot (the misses
// that made the core's per-request cost grow with the live set,
// docs/fence-cost.md). Deletion shifts later entries back, so there are no
// tombstones and a probe never walks past its run.
//
// The hash is seeded per process (as Go's own maps are) and by the owner's
// instance or session, so that router-chosen rooms cannot be picked to
// collide. Nothing but the tests iterates an index, so the seed changes only
// where keys sit, never what the state machine does.
type keyIndex[V comparable] struct {
	slots []keySlot[V]
	n     int
	seed  uint64
}

// keySlot is one slot; a zero val marks it empty (records are pointers).
type keySlot[V comparable] struct {
	key RequestKey
	val V
}

func (x *keyIndex[V]) home(k RequestKey) int {
	return int(mix64(mix64(k.Room^x.seed)^k.Gen) & uint64(len(x.slots)-1))
}

// find returns k's slot, or the empty slot where k would go (-1: no slots).
func (x *keyIndex[V]) find(k RequestKey) int {
	if len(x.slots) == 0 {
		return -1
	}
	var zero V
	mask := len(x.slots) - 1
	for i := x.home(k); ; i = (i + 1) & mask {
		if s := &x.slots[i]; s.val == zero || s.key == k {
			return i
		}
	}
}

// get returns k's record, or the zero V.
func (x *keyIndex[V]) get(k RequestKey) V {
	if i := x.find(k); i >= 0 && x.slots[i].key == k {
		return x.slots[i].val
	}
	var zero V
	return zero
}

// put sets k's record (v must not be the zero V).
func (x *keyIndex[V]) put(k RequestKey, v V) {
	if 2*(x.n+1) > len(x.slots) {
		x.grow()
	}
	i := x.find(k)
	var zero V
	if x.slots[i].val == zero {
		x.n++
	}
	x.slots[i] = keySlot[V]{key: k, val: v}
}

// del forgets k, shifting the rest of its run back into the hole.
func (x *keyIndex[V]) del(k RequestKey) {
	i := x.find(k)
	var zero V
	if i < 0 || x.slots[i].val == zero || x.slots[i].key != k {
		return
	}
	mask := len(x.slots) - 1
	for j := (i + 1) & mask; x.slots[j].val != zero; j = (j + 1) & mask {
		// An entry may fill the hole at i unless its home lies
		// cyclically in (i, j]: then it must stay at or after its home.
		if h := x.home(x.slots[j].key); (j-h)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = keySlot[V]{}
	x.n--
}

func (x *keyIndex[V]) len() int { return x.n }

func (x *keyIndex[V]) grow() {
	old := x.slots
	x.slots = make([]keySlot[V], max(16, 2*len(old)))
	x.n = 0
	var zero V
	for _, s := range old {
		if s.val != zero {
			x.put(s.key, s.val)
		}
	}
}

// each calls f on every entry, in slot order (tests and inspection).
func (x *keyIndex[V]) each(f func(RequestKey, V)) {
	var zero V
	for _, s := range x.slots {
		if s.val != zero {
			f(s.key, s.val)
		}
	}
}
