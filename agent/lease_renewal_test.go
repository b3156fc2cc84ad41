package agent

import (
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/oracle"
)

// A request that takes several leases to write is carried by the rank
// lease: heartbeats of changes over the real control link renew it, and it
// is handed off, not lapsed.
func TestLeaseRenewedAcrossHeartbeats(t *testing.T) {
	d, p := startPair(t, func(c *DecodeConfig) { c.Lease = time.Second; c.MaxHold = 20 * time.Second }, nil, nil)
	key := core.RequestKey{Room: 1, Gen: 1}
	const pages = 4
	rv := d.NewReceiver(key)
	if _, err := rv.Init(pages, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	snd := p.NewSender(key)
	if err := snd.Init(pages); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < pages; i++ {
		time.Sleep(1200 * time.Millisecond) // past the Assign's lease: only renewal keeps it
		oracle.FillShard(snd.Page(i), oracle.PageIdentity{Room: key.Room, Gen: key.Gen, Page: uint32(i), Rank: 1})
		if err := snd.Send(i + 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := snd.Finish(pages); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rv.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("request never finished")
	}
	if err := rv.Err(); err != nil {
		t.Fatalf("request failed: %v (rank lease not renewed?)", err)
	}
	rv.Finish()
	<-snd.Done()
	snd.Close()
	if st := d.Stats(); st.Core.Grants == 0 {
		t.Fatalf("no rank lease granted: %+v", st.Core)
	}
}
