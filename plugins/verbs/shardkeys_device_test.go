package verbs

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// TestDeviceShardKeys (issue 19 item 2, on the device; runs in the
// Soft-RoCE VM, skips without an RDMA device): verbs declares bounds
// window, so decode grants each rank one key per shard. Rank 1 writes at
// every shard-aligned offset of the slots under every key it holds: the
// device refuses each write outside the key's own shard, and rank 0's
// shards stay untouched. A pieced Grant is refused (Unimplemented), never
// granted as its whole span.
func TestDeviceShardKeys(t *testing.T) {
	const shard, shards, slots, fillOther = 4096, 2, 4, 0x6B
	s, r := deviceConfigs(t, RevokeAuto)
	e, st, rt := newEnv(t, s, r)
	ctx := context.Background()
	if info, _ := rt.Info(ctx); info.Capabilities.Bounds != sdk.BoundsWindow {
		t.Fatalf("verbs declares bounds %v, want window", info.Capabilities.Bounds)
	}
	if _, err := rt.Grant(ctx, sdk.Window{Region: e.DstID, Length: (slots-1)*shards*shard + shard, Stride: shards * shard, Piece: shard}); !errdefs.Is(err, errdefs.Unimplemented) {
		t.Fatalf("pieced Grant: %v, want unimplemented", err)
	}
	mem := e.Dst.Bytes()[:slots*shards*shard]
	fill(mem, fillOther)
	var keys []sdk.Key // rank 1's: its shard (position 1) of each slot
	for slot := uint64(0); slot < slots; slot++ {
		k, err := rt.Grant(ctx, sdk.Window{Region: e.DstID, Offset: slot*shards*shard + shard, Length: shard})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	for i, k := range keys {
		for off := uint64(shard); off < uint64(len(mem)); off += shard {
			id := e.NewBatchID()
			if err := st.Post(ctx, e.Write(id, k, 0, off, shard)); err != nil {
				continue // refused at Post: nothing moved
			}
			c, err := e.Wait(id)
			if err != nil || c.Status == sdk.Succeeded {
				t.Fatalf("rank 1's key %d at window offset %d (outside its shard): %+v %v", i, off, c, err)
			}
			if c.Status == sdk.InDoubt {
				if _, err := st.Quiesce(ctx, e.Peer, []sdk.BatchID{id}); err != nil {
					t.Fatalf("Quiesce after a refused write: %v", err)
				}
			}
		}
	}
	for slot := 0; slot < slots; slot++ {
		other := mem[slot*shards*shard:][:shard]
		if !bytes.Equal(other, bytes.Repeat([]byte{fillOther}, shard)) {
			t.Fatalf("rank 0's shard in slot %d was written under rank 1's keys", slot)
		}
	}
	// Rank 1's own shard still takes its write.
	id := e.NewBatchID()
	if err := st.Post(ctx, e.Write(id, keys[2], 0, 0, shard)); err != nil {
		t.Fatal(err)
	}
	if c, err := e.Wait(id); err != nil || c.Status != sdk.Succeeded || !bytes.Equal(mem[2*shards*shard+shard:][:shard], e.Src.Bytes()[:shard]) {
		t.Fatalf("rank 1 in its own shard: %+v %v", c, err)
	}
}
