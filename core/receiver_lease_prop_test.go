package core

import (
	"pgregory.net/rapid"
)

// beatRank is the property test's prefill rank for heartbeats: it keeps
// its list and its unanswered changes as a Sender does, and from decode's
// Leases it derives, by the Sender's rule (a Lease covers a listed tag of
// its instance, listed in a heartbeat it answers, never excluded), the
// latest lease each tag may be posted under. The timeout bounds are checked
// against that.
type beatRank struct {
	rank     RankID
	session  uint64
	seq      uint64
	acked    uint64
	needFull bool
	listed   map[Tag]uint64 // tag → the first heartbeat that carried it (0: none yet)
	ever     map[Tag]bool   // listed once: a tag never starts twice
	excluded map[Tag]bool
	changes  []listChange
	sent     []Message // earlier heartbeats, to deliver again late
	badSeq   uint64    // a heartbeat sent with a wrong digest
}

func newBeatRank(rank RankID, session uint64) *beatRank {
	return &beatRank{rank: rank, session: session, needFull: true,
		listed: map[Tag]uint64{}, ever: map[Tag]bool{}, excluded: map[Tag]bool{}}
}

// beat changes the list at random and makes the next heartbeat.
func (b *beatRank) beat(t *rapid.T, pick func() Tag) Message {
	for n := rapid.IntRange(0, 2).Draw(t, "starts"); n > 0; n-- {
		if tag := pick(); !b.ever[tag] {
			b.ever[tag] = true
			b.listed[tag] = 0
			b.changes = append(b.changes, listChange{tag: tag})
		}
	}
	if len(b.listed) > 0 && rapid.IntRange(0, 2).Draw(t, "end") == 0 {
		tag := pick()
		if _, ok := b.listed[tag]; ok {
			delete(b.listed, tag)
			b.changes = append(b.changes, listChange{tag: tag, ended: true})
		}
	}
	b.seq++
	m := Message{Kind: KindHeartbeat, Rank: b.rank, Decode: 100, Session: b.session, Seq: b.seq}
	for tag := range b.listed {
		m.Count++
		m.Digest += TagHash(tag)
	}
	if b.needFull || rapid.IntRange(0, 19).Draw(t, "full") == 0 {
		m.Full, b.needFull, b.changes = true, false, b.changes[:0]
		for tag := range b.listed {
			b.listed[tag] = b.seq
			m.Tags = append(m.Tags, tag)
		}
	} else {
		for i := range b.changes {
			c := &b.changes[i]
			if c.seq == 0 {
				c.seq = b.seq
				if _, ok := b.listed[c.tag]; ok && !c.ended && b.listed[c.tag] == 0 {
					b.listed[c.tag] = b.seq
				}
			}
			if c.ended {
				m.Ended = append(m.Ended, c.tag)
			} else {
				m.Tags = append(m.Tags, c.tag)
			}
		}
	}
	if rapid.IntRange(0, 39).Draw(t, "bad-digest") == 0 {
		m.Digest++ // a copy that diverged: decode must not grant over it
		b.badSeq = b.seq
	}
	b.sent = append(b.sent, m)
	return m
}

// onLease applies decode's answer as the rank does, and raises the leases
// of the tags it covers in the shadow. It fails the test if decode renews
// a lapsed lease or grants over a list whose digest did not match.
func (b *beatRank) onLease(t *rapid.T, m Message, now Time, shadow map[Tag]*shadowExposure, step string) {
	if m.Session != b.session || m.Seq > b.seq || m.Seq <= b.acked {
		return
	}
	b.acked = m.Seq
	if m.Full {
		b.needFull = true
		return
	}
	if m.Seq == b.badSeq && m.LeaseUntil != 0 {
		t.Fatalf("%s: decode granted rank %d a lease over heartbeat %d whose digest did not match its list", step, b.rank, m.Seq)
	}
	n := 0
	for n < len(b.changes) && b.changes[n].seq != 0 && b.changes[n].seq <= m.Seq {
		n++
	}
	b.changes = append(b.changes[:0], b.changes[n:]...)
	for _, tag := range m.Tags {
		if _, ok := b.listed[tag]; ok {
			b.excluded[tag] = true
		}
	}
	if m.LeaseUntil == 0 {
		return
	}
	for tag, seq := range b.listed {
		s := shadow[tag]
		if s == nil || b.excluded[tag] || seq == 0 || seq > m.Seq || tag.Instance != m.Tag.Instance {
			continue
		}
		old, assigned := s.lease[b.rank]
		if !assigned {
			continue // never assigned to this rank: it never posts for it
		}
		if l := min(m.LeaseUntil, s.hold); l > old {
			if now >= old {
				t.Fatalf("%s: rank %d's lapsed lease of %s (%d) renewed to %d at %d", step, b.rank, tag, old, l, now)
			}
			s.lease[b.rank] = l
		}
	}
}

// late is an earlier heartbeat of this incarnation, delivered again.
func (b *beatRank) late(t *rapid.T) (Message, bool) {
	if len(b.sent) == 0 {
		return Message{}, false
	}
	return rapid.SampledFrom(b.sent).Draw(t, "late"), true
}
