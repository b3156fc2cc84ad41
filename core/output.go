package core

import "time"

// ReleasePath is how exposed memory went back to the pool (I3).
type ReleasePath uint8

const (
	PathDrained   ReleasePath = iota // every rank that may touch it acknowledged a drain (with a fence: and then the revoke was confirmed)
	PathFenced                       // the transport revoked access before every rank acknowledged (evidence)
	PathTimeout                      // past lease + the writer's tail + margin (with a fence: a revoke that never confirmed)
	PathCompleted                    // handed off and finished by the decode loop (with a fence: and revoked)
	PathUnsafe                       // a known-unsafe variant let it go early
	numPaths
)

var pathNames = [...]string{"drained", "fenced", "timeout", "completed", "unsafe"}

func (p ReleasePath) String() string {
	if p >= numPaths {
		return "path?"
	}
	return pathNames[p]
}

// Envelope is a message for one peer.
type Envelope struct {
	To  RankID
	Msg Message
}

// BatchID names one transport batch posted by a Sender.
type BatchID uint64

// Post asks the caller to post one batch of one-sided writes: pages
// [FirstPage, FirstPage+len(Slots)) of the request go to these decode slots.
type Post struct {
	Batch     BatchID
	Tag       Tag
	Decode    RankID
	FirstPage uint32
	Slots     []uint32
}

// Quiesce asks the caller to make the transport return only when none of
// these batches can still move bytes, then to report Quiesced.
type Quiesce struct {
	Decode  RankID
	Batches []BatchID
}

// Revoke asks the receiving transport to revoke the keys of an exposure (or,
// with All, every key that an earlier instance registered) and to report
// Revoked once later writes under them can no longer land.
type Revoke struct {
	Tag Tag
	All bool
}

// Handoff hands a fully written request to the decode loop.
type Handoff struct {
	Tag   Tag
	Slots []uint32
}

// Release returns an exposure's slots to the pool, by one path.
type Release struct {
	Tag   Tag
	Slots []uint32
	Path  ReleasePath
	// Held is how long the slots were held after the request stopped
	// (abort, reject or failure) — zero for completed requests.
	Held time.Duration
}

// Failure tells the engine that a request ended badly (poll → Failed). The
// request's memory is still held until its Release.
type Failure struct {
	Tag    Tag
	Reason Reason
}

// Sent tells the prefill engine that a request reached every decode rank
// (poll → Success on the sender).
type Sent struct {
	Key    RequestKey
	Decode RankID
}

// SourceRelease tells the prefill engine that no operation can still read a
// request's source pages (I7): they may be reused.
type SourceRelease struct {
	Key RequestKey
}

// Output is what one input produced. Its slices stay valid until the next
// input to the same state machine; the caller acts on all of it in order.
type Output struct {
	Messages       []Envelope
	Posts          []Post
	Quiesces       []Quiesce
	Revokes        []Revoke
	Restarts       []RestartTarget
	Handoffs       []Handoff
	Releases       []Release
	Failures       []Failure
	Sent           []Sent
	SourceReleases []SourceRelease
}

func (o *Output) reset() {
	o.Messages = o.Messages[:0]
	o.Posts = o.Posts[:0]
	o.Quiesces = o.Quiesces[:0]
	o.Revokes = o.Revokes[:0]
	o.Restarts = o.Restarts[:0]
	o.Handoffs = o.Handoffs[:0]
	o.Releases = o.Releases[:0]
	o.Failures = o.Failures[:0]
	o.Sent = o.Sent[:0]
	o.SourceReleases = o.SourceReleases[:0]
}

// Empty reports whether the output asks for nothing.
func (o *Output) Empty() bool {
	return len(o.Messages)+len(o.Posts)+len(o.Quiesces)+len(o.Revokes)+len(o.Restarts)+len(o.Handoffs)+
		len(o.Releases)+len(o.Failures)+len(o.Sent)+len(o.SourceReleases) == 0
}
