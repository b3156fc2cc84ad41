package core

import (
	"fmt"
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// TestKeyIndexMatchesMap: any sequence of puts and deletes over a few
// rooms (so that runs collide and wrap) leaves keyIndex agreeing with a Go
// map on every key, and every entry reachable from its home. Half the runs
// keep only 4 bits of fingerprint, so that distinct keys share one and only
// the key comparison tells them apart.
func TestKeyIndexMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := keyIndex[*int]{seed: rapid.Uint64().Draw(t, "seed")}
		if rapid.Bool().Draw(t, "loose") {
			x.loose = 0x7ffffff0
		}
		want := map[RequestKey]*int{}
		keys := rapid.IntRange(1, 64).Draw(t, "keys")
		for i, n := 0, rapid.IntRange(1, 400).Draw(t, "ops"); i < n; i++ {
			k := RequestKey{Room: uint64(rapid.IntRange(0, keys).Draw(t, "room")), Gen: uint64(rapid.IntRange(0, 2).Draw(t, "gen"))}
			if rapid.Bool().Draw(t, "put") {
				v := new(int)
				x.put(k, v)
				want[k] = v
			} else {
				x.del(k)
				delete(want, k)
			}
			if x.len() != len(want) {
				t.Fatalf("op %d: %d entries, want %d", i, x.len(), len(want))
			}
			checkOver(t, &x)
			for room := 0; room <= keys; room++ {
				for gen := 0; gen <= 2; gen++ {
					k := RequestKey{Room: uint64(room), Gen: uint64(gen)}
					if got := x.get(k); got != want[k] {
						t.Fatalf("op %d: get(%s) = %p, want %p", i, k, got, want[k])
					}
				}
			}
		}
		seen := 0
		x.each(func(k RequestKey, v *int) {
			seen++
			if want[k] != v {
				t.Fatalf("each: %s = %p, want %p", k, v, want[k])
			}
		})
		if seen != len(want) {
			t.Fatalf("each saw %d entries, want %d", seen, len(want))
		}
	})
}

// TestKeyIndexFingerprintCollision: two keys with one hash (and so one
// tag and one home) are two entries; deleting one leaves the other. Without the key
// comparison in find, the second put would overwrite the first.
func TestKeyIndexFingerprintCollision(t *testing.T) {
	x := keyIndex[*int]{seed: 7, loose: 0x7ffffff0}
	a := RequestKey{Room: 1, Gen: 1}
	b := a
	for b.Room++; x.hash(b) != x.hash(a); b.Room++ {
	}
	va, vb := new(int), new(int)
	x.put(a, va)
	x.put(b, vb)
	if x.len() != 2 || x.get(a) != va || x.get(b) != vb {
		t.Fatalf("colliding keys: len %d, get(a) %p (want %p), get(b) %p (want %p)", x.len(), x.get(a), va, x.get(b), vb)
	}
	x.del(a)
	if x.len() != 1 || x.get(a) != nil || x.get(b) != vb {
		t.Fatalf("after del(a): len %d, get(a) %p, get(b) %p (want %p)", x.len(), x.get(a), x.get(b), vb)
	}
}

// checkOver: every group's over is the number of keys placed past it from
// a home at or before it (what lets a lookup stop there), and a group is 64
// bytes (one cache line).
func checkOver(t interface{ Fatalf(string, ...any) }, x *keyIndex[*int]) {
	if sz := unsafe.Sizeof(keyGroup{}); sz != 64 {
		t.Fatalf("keyGroup is %d bytes, want 64", sz)
	}
	mask := len(x.groups) - 1
	want := make([]uint32, len(x.groups))
	for g := range x.groups {
		for l, c := range x.groups[g].tags {
			if c == 0 {
				continue
			}
			k := x.entries[x.groups[g].entries[l]].key
			for h := int(x.hash(k)) & mask; h != g; h = (h + 1) & mask {
				want[h]++
			}
		}
	}
	for g := range x.groups {
		if x.groups[g].over != want[g] {
			t.Fatalf("group %d: over %d, want %d", g, x.groups[g].over, want[g])
		}
	}
}

// keyIndexSizes are the live key counts the key index benchmarks compare.
var keyIndexSizes = []int{100, 100_000}

// filledIndex is an index of live keys with rooms drawn at random (as a
// router's are), and those keys.
func filledIndex(live int) (*keyIndex[*int], []RequestKey) {
	x := &keyIndex[*int]{seed: 1}
	keys := make([]RequestKey, live)
	v := new(int)
	for i := range keys {
		keys[i] = RequestKey{Room: mix64(uint64(i) + 1), Gen: 1}
		x.put(keys[i], v)
	}
	return x, keys
}

// BenchmarkKeyIndexGet: one lookup of a live key, a different key each
// time in a random order (what a heartbeat's list of changed tags or a
// Tick's expired tombstones cost; the remembered key never answers).
func BenchmarkKeyIndexGet(b *testing.B) {
	for _, live := range keyIndexSizes {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			x, keys := filledIndex(live)
			i := uint64(0)
			b.ResetTimer()
			for range b.N {
				i++
				if x.get(keys[mix64(i)%uint64(live)]) == nil {
					b.Fatal("live key not found")
				}
			}
		})
	}
}

// BenchmarkKeyIndexNewKey: a new random key's lookup (absent), insertion
// and deletion among live keys, as each side does once per request.
func BenchmarkKeyIndexNewKey(b *testing.B) {
	for _, live := range keyIndexSizes {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			x, _ := filledIndex(live)
			v := new(int)
			b.ResetTimer()
			for i := range b.N {
				k := RequestKey{Room: mix64(uint64(i) + 1<<40), Gen: 2}
				if x.get(k) != nil {
					b.Fatal("new key found")
				}
				x.put(k, v)
				x.del(k)
			}
		})
	}
}
