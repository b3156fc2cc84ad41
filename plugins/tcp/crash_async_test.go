package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The crash semantics with the asynchronous Post every host gets by
// default (Post returns once the batch is in the ring): a refused batch completes FailedDefinite once; after kill -9
// every batch that went in completes InDoubt exactly once, and the exit
// evidence covers exactly those.
func TestKillPluginMidTransferAsyncPost(t *testing.T) {
	p, region, peer, got := stalledPluginSender(t, sdk.OpenOptions{})
	if !p.AsyncPost() {
		t.Fatal("AsyncPost not in effect")
	}
	tr := p.Transport()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	write := func(id sdk.BatchID, region sdk.RegionID) sdk.Batch {
		return sdk.Batch{ID: id, Peer: peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: region, RemoteKey: 7, Length: 4 << 20}}}
	}
	if err := tr.Post(ctx, write(100, region+1000)); err != nil {
		t.Fatalf("async Post of an unregistered region: %v, want nil (refused by completion)", err)
	}
	select {
	case c := <-tr.Completions():
		if c.Batch != 100 || c.Status != sdk.FailedDefinite || c.Class != errdefs.NotFound {
			t.Fatalf("refused batch: %+v, want FailedDefinite not-found", c)
		}
	case <-ctx.Done():
		t.Fatal("no completion for the refused batch")
	}
	var ids []sdk.BatchID
	for id := sdk.BatchID(1); id <= 8; id++ {
		if err := tr.Post(ctx, write(id, region)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("no bytes reached the receiver")
	}
	killInFlight(t, p)
	seen := map[sdk.BatchID]sdk.Status{}
	for c := range tr.Completions() {
		if _, dup := seen[c.Batch]; dup || c.Status != sdk.InDoubt {
			t.Fatalf("after the kill: %+v (seen %v), want one InDoubt per batch", c, seen)
		}
		seen[c.Batch] = c.Status
	}
	if len(seen) != len(ids) {
		t.Fatalf("after the kill: %v, want InDoubt for %v", seen, ids)
	}
	for {
		select {
		case ev := <-p.Events():
			if ev.Kind != sdk.EventPluginExited {
				continue
			}
			if ev.Evidence != sdk.EvidenceProcessExited || len(ev.Batches) != len(ids) {
				t.Fatalf("exit event %+v, want process-exited for %v", ev, ids)
			}
			return
		case <-ctx.Done():
			t.Fatal("no plugin-exited event")
		}
	}
}

// stalledPluginSender opens the plugin with opts, registers a 16 MiB
// source and connects it to a receiver that reads a little and then
// stalls (got is closed once bytes arrived). The plugin's ack timeout and
// write TTL are an hour: however slow the machine, a batch in flight ends
// only by the test's kill, never by the plugin's own timeout.
func stalledPluginSender(t *testing.T, opts sdk.OpenOptions) (*sdk.Plugin, sdk.RegionID, sdk.PeerID, <-chan struct{}) {
	t.Helper()
	opts.Env = append(opts.Env, "KVFENCE_TCP_ACK_TIMEOUT=1h", "KVFENCE_TCP_WRITE_TTL=1h")
	p := sdktest.Subprocess(t, pluginBin, opts)
	ctx := context.Background()
	src, err := sdk.NewSharedMemory("src", 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	region, err := p.Transport().RegisterMemory(ctx, src.Desc())
	if err != nil {
		t.Fatal(err)
	}
	addr, got := fakeStalledReceiver(t)
	peer, err := p.Transport().Connect(ctx, sdk.Endpoint{Transport: Name, Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	return p, region, peer, got
}
