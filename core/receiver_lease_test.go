package core

import (
	"testing"
	"time"
)

// A covered tag whose rank lease lapsed (no Tick acted on it yet) is not
// renewed by the next heartbeat: decode answers without a lease, and a
// heartbeat whose digest does not match gets a resync, never a lease.
func TestRankLeaseNeverRenewsALapsedLease(t *testing.T) {
	r, err := NewReceiver(ReceiverConfig{Instance: 1, Self: 100, Slots: 4, Lease: time.Millisecond, MaxHold: 10 * time.Millisecond}, 0)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := r.Admit(RequestKey{Room: 1, Gen: 1}, []RankID{0}, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	hb := Message{Kind: KindHeartbeat, Rank: 0, Decode: 100, Session: 9, Seq: 1, Full: true, Tags: []Tag{tag}, Count: 1, Digest: TagHash(tag)}
	answer := func(m Message, now Time) Message {
		t.Helper()
		r.Step(m, now)
		for _, e := range r.Ready().Messages {
			if e.Msg.Kind == KindLease {
				return e.Msg
			}
		}
		t.Fatalf("no Lease answers %s", m)
		return Message{}
	}
	if got := answer(hb, Time(100*time.Microsecond)); got.LeaseUntil != Time(1100*time.Microsecond) {
		t.Fatalf("first answer %s, want a lease until 1.1ms", got)
	}
	hb.Full, hb.Tags, hb.Seq = false, nil, 2
	if got := answer(hb, Time(1200*time.Microsecond)); got.LeaseUntil != 0 || got.Full {
		t.Fatalf("answer after the rank lease lapsed: %s, want no lease", got)
	}
	hb.Seq, hb.Digest = 3, hb.Digest+1
	if got := answer(hb, Time(1300*time.Microsecond)); got.LeaseUntil != 0 || !got.Full {
		t.Fatalf("answer to a diverged digest: %s, want a resync", got)
	}
}
