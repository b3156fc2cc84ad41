package core

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
)

func sampleMessages() []Message {
	tag := Tag{Instance: 3, Room: 1 << 40, Gen: 9}
	return []Message{
		{Kind: KindAssign, Tag: tag, Rank: 1, Decode: 100, LeaseUntil: 123456789, HoldUntil: 987654321, Ranks: []RankID{0, 1}, Slots: []uint32{4, 5, 1 << 20}},
		{Kind: KindGrant, Tag: tag, Rank: 1, Decode: 100, LeaseUntil: -5},
		{Kind: KindHeartbeat, Rank: 1, Decode: 100, Session: 1 << 63, Seq: 12, Tags: []Tag{tag, {Instance: 1}}, Ended: []Tag{{Room: 2}},
			Count: 5, Digest: 0xfeedfacecafebeef, Outstanding: 7},
		{Kind: KindHeartbeat, Rank: 1, Decode: 100, Session: 4, Seq: 1, Full: true, Tags: []Tag{tag}, Count: 1, Digest: TagHash(tag)},
		{Kind: KindLease, Tag: Tag{Instance: 3}, Rank: 1, Decode: 100, Session: 4, Seq: 12, LeaseUntil: 99, Tags: []Tag{tag}},
		{Kind: KindLease, Tag: Tag{Instance: 3}, Rank: 1, Decode: 100, Session: 4, Seq: 13, Full: true},
		{Kind: KindCommit, Tag: tag, Rank: 1, Decode: 100, Coverage: 3, Checksum: 0xdeadbeefcafef00d},
		{Kind: KindFail, Tag: tag, Rank: 1, Decode: 100, Reason: ReasonSendFailed},
		{Kind: KindAbort, Tag: tag, Rank: 1, Decode: 100, LeaseUntil: 42, Reason: ReasonClientAbort},
		{Kind: KindDrainAck, Tag: tag, Rank: 1, Decode: 100, Evidence: EvidenceQuiesced},
		{Kind: KindReject, Tag: tag, Rank: 1, Decode: 100, Reason: ReasonRejected},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		b := AppendMessage(nil, &m)
		got, err := DecodeMessage(b)
		if err != nil {
			t.Fatalf("%s: %v", m.Kind, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("%s: round trip\n got %+v\nwant %+v", m.Kind, got, m)
		}
	}
}

func TestCodecRejectsBadInput(t *testing.T) {
	good := AppendMessage(nil, &sampleMessages()[0])
	cases := map[string][]byte{
		"empty":         nil,
		"wrong version": append([]byte{9}, good[1:]...),
		"unknown kind":  {MessageVersion, 99, 0, 0, 0, 0, 0},
		"kind zero":     {MessageVersion, 0, 0, 0, 0, 0, 0},
		"truncated":     good[:len(good)-1],
		"trailing":      append(append([]byte{}, good...), 0),
		"huge count":    {MessageVersion, byte(KindAssign), 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f},
		"bad flag":      {MessageVersion, byte(KindLease), 0, 0, 0, 0, 0, 0, 0, 2, 0, 0},
		"bad reason":    {MessageVersion, byte(KindFail), 0, 0, 0, 0, 0, 200},
		"bad evidence":  {MessageVersion, byte(KindDrainAck), 0, 0, 0, 0, 0, 200},
		"rank overflow": {MessageVersion, byte(KindGrant), 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0},
	}
	for name, b := range cases {
		if _, err := DecodeMessage(b); !errors.Is(err, errdefs.InvalidArgument) {
			t.Errorf("%s: got %v, want an errdefs.InvalidArgument", name, err)
		}
	}
}

func TestAppendMessageDoesNotAllocate(t *testing.T) {
	m := sampleMessages()[0]
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = AppendMessage(buf[:0], &m) }); n != 0 {
		t.Fatalf("AppendMessage allocates %v times per call", n)
	}
}

// FuzzDecodeMessage: the decoder never panics, and whatever it accepts
// survives encode → decode unchanged.
func FuzzDecodeMessage(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(AppendMessage(nil, &m))
	}
	f.Add([]byte{MessageVersion, byte(KindAssign), 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMessage(data)
		if err != nil {
			if !errors.Is(err, errdefs.InvalidArgument) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		again, err := DecodeMessage(AppendMessage(nil, &m))
		if err != nil {
			t.Fatalf("re-decode of %+v: %v", m, err)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip changed the message:\n got %+v\nwant %+v", again, m)
		}
	})
}
