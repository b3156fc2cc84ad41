package core

import (
	"encoding/binary"

	"github.com/kvfence/kvfence/errdefs"
)

// MessageVersion is the version byte that starts every encoded core
// message (not the control plane's agent.ControlVersion, nor the plugin
// protocol's sdk.ProtocolVersion). A decoder refuses versions it does not
// know instead of guessing.
const MessageVersion = 2

// Limits that keep a hostile or corrupt message from making the decoder
// allocate without bound.
const (
	MaxWireRanks = 1024
	MaxWireSlots = 1 << 20
	MaxWireTags  = 1 << 16
)

// AppendMessage appends the compact binary encoding of m to b: a version
// byte, the kind, the tag and both ranks as uvarints, then the fields of that
// kind. It does not allocate when b has room.
func AppendMessage(b []byte, m *Message) []byte {
	b = append(b, MessageVersion, byte(m.Kind))
	b = appendTag(b, m.Tag)
	b = binary.AppendUvarint(b, uint64(m.Rank))
	b = binary.AppendUvarint(b, uint64(m.Decode))
	switch m.Kind {
	case KindAssign:
		b = binary.AppendVarint(b, int64(m.LeaseUntil))
		b = binary.AppendVarint(b, int64(m.HoldUntil))
		b = binary.AppendUvarint(b, uint64(len(m.Ranks)))
		for _, r := range m.Ranks {
			b = binary.AppendUvarint(b, uint64(r))
		}
		b = binary.AppendUvarint(b, uint64(len(m.Slots)))
		for _, s := range m.Slots {
			b = binary.AppendUvarint(b, uint64(s))
		}
	case KindGrant:
		b = binary.AppendVarint(b, int64(m.LeaseUntil))
	case KindHeartbeat:
		b = binary.AppendUvarint(b, m.Session)
		b = binary.AppendUvarint(b, m.Seq)
		b = appendBool(b, m.Full)
		b = appendTags(b, m.Tags)
		b = appendTags(b, m.Ended)
		b = binary.AppendUvarint(b, uint64(m.Count))
		b = binary.AppendUvarint(b, m.Digest)
		b = binary.AppendUvarint(b, uint64(m.Outstanding))
	case KindLease:
		b = binary.AppendUvarint(b, m.Session)
		b = binary.AppendUvarint(b, m.Seq)
		b = appendBool(b, m.Full)
		b = binary.AppendVarint(b, int64(m.LeaseUntil))
		b = appendTags(b, m.Tags)
	case KindCommit:
		b = binary.AppendUvarint(b, uint64(m.Coverage))
		b = binary.AppendUvarint(b, m.Checksum)
	case KindFail, KindReject:
		b = append(b, byte(m.Reason))
	case KindAbort:
		b = binary.AppendVarint(b, int64(m.LeaseUntil))
		b = append(b, byte(m.Reason))
	case KindDrainAck:
		b = append(b, byte(m.Evidence))
	}
	return b
}

func appendTags(b []byte, tags []Tag) []byte {
	b = binary.AppendUvarint(b, uint64(len(tags)))
	for _, t := range tags {
		b = appendTag(b, t)
	}
	return b
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendTag(b []byte, t Tag) []byte {
	b = binary.AppendUvarint(b, t.Instance)
	b = binary.AppendUvarint(b, t.Room)
	return binary.AppendUvarint(b, t.Gen)
}

// DecodeMessage parses one message. It never panics; any malformed input
// (unknown version or kind, truncation, trailing bytes, values out of range)
// yields an error of class errdefs.InvalidArgument.
func DecodeMessage(data []byte) (Message, error) {
	d := decoder{buf: data}
	var m Message
	if v := d.byte(); d.err == nil && v != MessageVersion {
		return m, errorf(errdefs.InvalidArgument, "message version %d, want %d", v, MessageVersion)
	}
	m.Kind = Kind(d.byte())
	if d.err == nil && (m.Kind == 0 || m.Kind > kindMax) {
		return m, errorf(errdefs.InvalidArgument, "unknown message kind %d", uint8(m.Kind))
	}
	m.Tag = d.tag()
	m.Rank = RankID(d.uvarint32())
	m.Decode = RankID(d.uvarint32())
	d.body(&m)
	if d.err == nil && len(d.buf) != 0 {
		d.fail("%d trailing bytes after %s", len(d.buf), m.Kind)
	}
	if d.err != nil {
		return Message{}, d.err
	}
	return m, nil
}

// body parses the fields of m's kind, in the order AppendMessage writes
// them.
func (d *decoder) body(m *Message) {
	switch m.Kind {
	case KindAssign:
		d.assign(m)
	case KindGrant:
		m.LeaseUntil = Time(d.varint())
	case KindHeartbeat:
		m.Session = d.uvarint()
		m.Seq = d.uvarint()
		m.Full = d.bool()
		m.Tags = d.tags()
		m.Ended = d.tags()
		m.Count = d.uvarint32()
		m.Digest = d.uvarint()
		m.Outstanding = d.uvarint32()
	case KindLease:
		m.Session = d.uvarint()
		m.Seq = d.uvarint()
		m.Full = d.bool()
		m.LeaseUntil = Time(d.varint())
		m.Tags = d.tags()
	case KindCommit:
		m.Coverage = d.uvarint32()
		m.Checksum = d.uvarint()
	case KindFail, KindReject:
		m.Reason = d.reason()
	case KindAbort:
		m.LeaseUntil = Time(d.varint())
		m.Reason = d.reason()
	case KindDrainAck:
		m.Evidence = DrainEvidence(d.byte())
		if d.err == nil && m.Evidence > evidenceMax {
			d.fail("unknown evidence %d", uint8(m.Evidence))
		}
	}
}

// assign parses an Assign's lease, hold bound, ranks and slots.
func (d *decoder) assign(m *Message) {
	m.LeaseUntil = Time(d.varint())
	m.HoldUntil = Time(d.varint())
	if n := d.count(MaxWireRanks); n > 0 {
		m.Ranks = make([]RankID, n)
		for i := range m.Ranks {
			m.Ranks[i] = RankID(d.uvarint32())
		}
	}
	if n := d.count(MaxWireSlots); n > 0 {
		m.Slots = make([]uint32, n)
		for i := range m.Slots {
			m.Slots[i] = d.uvarint32()
		}
	}
}

type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = errorf(errdefs.InvalidArgument, format, args...)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.buf) == 0 {
		d.fail("message truncated")
		return 0
	}
	c := d.buf[0]
	d.buf = d.buf[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("bad or truncated uvarint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail("bad or truncated varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) uvarint32() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.fail("value %d does not fit 32 bits", v)
		return 0
	}
	return uint32(v)
}

// count reads a length and checks it against max and against the bytes left
// (every element takes at least one byte), before anything is allocated.
func (d *decoder) count(max int) int {
	v := d.uvarint()
	if d.err != nil {
		return 0
	}
	if v > uint64(max) || v > uint64(len(d.buf)) {
		d.fail("count %d out of range", v)
		return 0
	}
	return int(v)
}

func (d *decoder) tag() Tag {
	return Tag{Instance: d.uvarint(), Room: d.uvarint(), Gen: d.uvarint()}
}

func (d *decoder) tags() []Tag {
	n := d.count(MaxWireTags)
	if n == 0 {
		return nil
	}
	tags := make([]Tag, n)
	for i := range tags {
		tags[i] = d.tag()
	}
	return tags
}

func (d *decoder) bool() bool {
	switch c := d.byte(); c {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("bad flag byte %d", c)
		return false
	}
}

func (d *decoder) reason() Reason {
	r := Reason(d.byte())
	if d.err == nil && r > reasonMax {
		d.fail("unknown reason %d", uint8(r))
	}
	return r
}
