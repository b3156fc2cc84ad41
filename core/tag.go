package core

import "fmt"

// RankID names one rank (a prefill rank or a decode rank) in a deployment.
type RankID uint32

// Tag names one exposure: the decode process incarnation, the request id
// (room) and the generation of that room's assignment. Reused room ids get a
// new generation, and a restarted decode a new instance, so a message that
// carries an old tag can never be confused with a current one.
type Tag struct {
	Instance uint64
	Room     uint64
	Gen      uint64
}

func (t Tag) String() string { return fmt.Sprintf("%d/%d/%d", t.Instance, t.Room, t.Gen) }

// RequestKey is how both engines name a request before decode has tagged it:
// the router's room and its generation (new on every retry or reuse).
type RequestKey struct {
	Room uint64
	Gen  uint64
}

func (k RequestKey) String() string { return fmt.Sprintf("%d/%d", k.Room, k.Gen) }

// Key returns the request key of a tag.
func (t Tag) Key() RequestKey { return RequestKey{Room: t.Room, Gen: t.Gen} }

// TagHash is a tag's contribution to a heartbeat digest. Digests are sums
// of it (mod 2^64), so that both ends can add and remove a tag in O(1)
// whatever the order; the mixing (splitmix64's finalizer over each field)
// keeps sums of different small sets of nearby tags apart.
func TagHash(t Tag) uint64 {
	h := mix64(t.Instance + 0x9e3779b97f4a7c15)
	h = mix64(h ^ t.Room)
	return mix64(h ^ t.Gen)
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
