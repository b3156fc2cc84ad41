package verbs

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// A key bound to its writer (sdk.Window.Writer, a type-2 memory window bound
// on that writer's responder QP) is refused to every other writer by the
// device itself: a second sender holding the same key gets a remote access
// error and its bytes land nowhere. The unbound arm is the known-unsafe
// variant: the same foreign write through an unbound key lands, so the
// check below can fail.
func TestDeviceWriterBoundKey(t *testing.T) {
	s, r := deviceConfigs(t, RevokeAuto)
	e, st, rt := newEnv(t, s, r)
	if !rt.writerBound() {
		t.Skipf("skipped: device %s has no type-2 memory windows", rt.Device())
	}
	if info, _ := rt.Info(context.Background()); !info.Capabilities.WriterBound {
		t.Fatal("type-2 windows present but WriterBound not declared")
	}
	ctx := context.Background()
	other := newT(t, s) // a second writer, with its own source memory
	src, err := sdk.NewSharedMemory("other-src", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	fill(src.Bytes(), 0xEE)
	srcID, err := other.RegisterMemory(ctx, src.Desc())
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := rt.LocalEndpoint(ctx)
	otherPeer, err := other.Connect(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Length: 4096, Writer: "127.0.0.1:1"}); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("grant to a writer that is not connected: %v, want FailedPrecondition", err)
	}
	dst := e.Dst.Bytes()
	fill(dst, 0x5A)
	writer := st.ln.Addr().String()
	kA, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Length: 64 << 10, Writer: writer})
	if err != nil {
		t.Fatal(err)
	}
	// The named writer's write lands.
	id := e.NewBatchID()
	if err := st.Post(ctx, e.Write(id, kA, 0, 0, 4096)); err != nil {
		t.Fatal(err)
	}
	if c, err := e.Wait(id); err != nil || c.Status != sdk.Succeeded || !bytes.Equal(dst[:4096], e.Src.Bytes()[:4096]) {
		t.Fatalf("the bound writer's write: %+v %v", c, err)
	}
	foreign := func(k sdk.Key, off uint64) sdk.Completion {
		t.Helper()
		id := e.NewBatchID()
		b := sdk.Batch{ID: id, Peer: otherPeer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: srcID, RemoteKey: k, RemoteOffset: off, Length: 4096}}}
		if err := other.Post(ctx, b); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(30 * time.Second)
		for {
			select {
			case c := <-other.Completions():
				if c.Batch == id {
					return c
				}
			case <-deadline:
				t.Fatal("no completion for the foreign write")
			}
		}
	}
	// Another writer with the same key: refused by the device.
	c := foreign(kA, 8192)
	if c.Status == sdk.Succeeded || !bytes.Equal(dst[8192:12288], bytes.Repeat([]byte{0x5A}, 4096)) {
		t.Fatalf("a foreign writer's write through a bound key: %+v (bytes landed: %v)", c, dst[8192] == 0xEE)
	}
	t.Logf("foreign writer, bound key: %v %s", c.Status, c.Detail)
	if _, err := other.Quiesce(ctx, otherPeer, []sdk.BatchID{c.Batch}); err != nil {
		t.Fatal(err)
	}
	// Known-unsafe variant: the same foreign write through an unbound key lands.
	kAny, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: 128 << 10, Length: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if c := foreign(kAny, 0); c.Status != sdk.Succeeded || dst[128<<10] != 0xEE {
		t.Fatalf("unbound key: the foreign write did not land (%+v): the check above proves nothing", c)
	}
	// Revoke: the bound writer's next write fails and lands nowhere.
	if _, err := e.Granter.Revoke(ctx, kA); err != nil {
		t.Fatal(err)
	}
	fill(e.Src.Bytes()[:4096], 0xC3)
	late := e.NewBatchID()
	if err := st.Post(ctx, e.Write(late, kA, 0, 16384, 4096)); err != nil {
		t.Fatal(err)
	}
	if c, err := e.Wait(late); err != nil || c.Status == sdk.Succeeded || dst[16384] != 0x5A {
		t.Fatalf("write after Revoke of a bound key: %+v %v", c, err)
	}
	stats, _ := rt.Stats(ctx)
	if stats["verbs.grants_mw2"] != 1 || stats["verbs.revokes_mw2"] != 1 {
		t.Fatalf("stats %v", stats)
	}
}
