package agent

import (
	"context"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

// disconnects records the peers a transport was told to forget.
type disconnects struct {
	sdk.Transport
	got []sdk.PeerID
}

func (d *disconnects) Disconnect(_ context.Context, peer sdk.PeerID) error {
	d.got = append(d.got, peer)
	return nil
}

// A retired lane is disconnected at once when nothing rides on it, and
// otherwise only when its last unsettled batch settles: a peer forgotten
// earlier could never quiesce its batches in doubt (TestDemoDecodeRestart
// caught that). A lane Connect hands back again is live, not retired.
func TestRetiredLanesDisconnectOnceSettled(t *testing.T) {
	tr := &disconnects{}
	p := &Prefill{tr: tr, log: hclog.NewNullLogger(), batchPeer: map[core.BatchID]sdk.PeerID{}}
	p.track(1, "a")
	p.track(2, "a")
	p.track(3, "c")
	p.dropLanes([]sdk.PeerID{"a", "b", "b"})
	if !slices.Equal(tr.got, []sdk.PeerID{"b"}) {
		t.Fatalf("after retiring a (2 batches) and b (none): disconnected %v, want [b]", tr.got)
	}
	p.untrack(1)
	if len(tr.got) != 1 {
		t.Fatalf("a disconnected with batch 2 still on it: %v", tr.got)
	}
	p.untrack(2)
	if !slices.Equal(tr.got, []sdk.PeerID{"b", "a"}) {
		t.Fatalf("a's last batch settled: disconnected %v, want [b a]", tr.got)
	}
	p.dropLanes([]sdk.PeerID{"c"})
	p.adoptLane("c") // Connect handed c back: in use again
	p.untrack(3)
	if len(tr.got) != 2 {
		t.Fatalf("a lane in use again was disconnected: %v", tr.got)
	}
	p.untrack(99) // unknown: nothing
}
