package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// lockedBuffer is a log sink the agent's goroutines and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines returns the @message of every JSON log line about tag, in order.
func (l *lockedBuffer) lines(tag core.Tag) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["tag"] == tag.String() {
			msg, _ := m["@message"].(string)
			if path, ok := m["path"].(string); ok {
				msg += " " + path
			}
			out = append(out, msg)
		}
	}
	return out
}

// TestLyingRankCannotWriteAfterRelease is finding 2 of issue 15 at the agent,
// with the TCP plugin as real processes on both sides: a prefill rank acks
// its drain and keeps writing. With a fence, decode gives the slot back only
// after the plugin revoked the keys (the hold log shows the fence before the
// drained release; before issue 15 the release came first and the revoke
// after it, as hygiene), so the liar's next write under its key is refused
// and the slot, now another request's, is untouched.
func TestLyingRankCannotWriteAfterRelease(t *testing.T) {
	ctx := context.Background()
	var log lockedBuffer
	plug := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
	d, err := NewDecode(ctx, DecodeConfig{Rank: 0, Slots: 1, ShardBytes: 4096, Shards: 1, Lease: 10 * time.Second,
		MaxHold: 20 * time.Second, Fence: true, ControlAddr: "127.0.0.1:0",
		Logger: hclog.New(&hclog.LoggerOptions{Output: &log, JSONFormat: true, Level: hclog.Info})}, plug.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)

	// The liar opens its own transport and links as prefill rank 1,
	// announcing its data identity as every prefill rank does (a rank that
	// announces none gets no keys: issue 19).
	tr := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{}).Transport()
	ep, err := tr.LocalEndpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion,
		Caps: peerCaps{Quiesce: true}, Writer: ep.Address})
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	waitFor(t, "the liar's link", func() bool { return writerTail(t, d.Metrics, 1) > 0 })
	src, err := sdk.NewSharedMemory("liar-src", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	region, err := tr.RegisterMemory(ctx, src.Desc())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := tr.Connect(ctx, sdk.Endpoint{Transport: l.peer.DataTransport, Address: l.peer.DataAddress})
	if err != nil {
		t.Fatal(err)
	}

	rv := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1})
	tag, err := rv.Init(1, []core.RankID{1})
	if err != nil {
		t.Fatal(err)
	}
	var keys []keyRef
	for keys == nil {
		f, err := l.recv(nil)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := core.DecodeMessage(f.Core); err == nil && m.Kind == core.KindAssign && m.Tag == tag {
			keys = f.Keys
		}
	}
	write := func(id sdk.BatchID, fill byte) sdk.Status {
		t.Helper()
		for i := range src.Bytes() {
			src.Bytes()[i] = fill
		}
		err := tr.Post(ctx, sdk.Batch{ID: id, Peer: peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: region,
			RemoteKey: sdk.Key(keys[0].Key), RemoteOffset: keys[0].Base, Length: 4096}}})
		if err != nil {
			return sdk.FailedDefinite // refused at Post: nothing moves
		}
		select {
		case c := <-tr.Completions():
			return c.Status
		case <-time.After(30 * time.Second):
			t.Fatal("no completion")
		}
		return 0
	}
	pool := d.mem.Bytes()[:4096]
	if st := write(1, 0xA1); st != sdk.Succeeded || pool[0] != 0xA1 {
		t.Fatalf("the honest write: %v, pool byte %#x", st, pool[0])
	}

	// Aborted; the rank acks its drain and will keep writing.
	rv.Abort()
	drain := core.Message{Kind: core.KindDrainAck, Tag: tag, Rank: 1, Decode: 0, Evidence: core.EvidenceCompleted}
	l.send(&frame{Type: frameCore, Core: core.AppendMessage(nil, &drain)})
	waitFor(t, "the drained release", rv.Released)
	if _, err := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1}).Init(1, []core.RankID{2}); err != nil {
		t.Fatalf("the next request did not get the freed slot: %v", err)
	}
	if st := write(2, 0xB2); st == sdk.Succeeded || pool[0] == 0xB2 {
		t.Fatalf("the liar wrote into the slot after it was released and reused: %v, pool byte %#x", st, pool[0])
	}
	got := log.lines(tag)
	fence, release := -1, -1
	for i, m := range got {
		switch m {
		case HoldFenceMsg:
			fence = i
		case HoldReleaseMsg + " drained":
			release = i
		}
	}
	if fence < 0 || release < fence {
		t.Fatalf("hold log of %s: want the fence before a drained release, got %q", tag, got)
	}
}
