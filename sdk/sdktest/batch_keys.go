package sdktest

import (
	"bytes"
	"context"
	"fmt"

	"github.com/kvfence/kvfence/sdk"
)

// Where checkBatchKeys grants: two windows past every other check's.
const batchOff, batchLen = 896 << 10, 4096

// checkBatchKeys: a KeyBatcher answers every item of a batch on its own.
// GrantMany grants the good windows beside a bad one; RevokeMany of two
// live keys around an unknown one revokes exactly the two (writes under
// them then land nowhere) and reports the unknown key as failed — a batch
// that partly failed is never reported as revoked whole.
func checkBatchKeys(ctx context.Context, e *Env) error {
	kb, ok := e.Granter.(sdk.KeyBatcher)
	if !ok {
		return notApplicable("the transport grants one key a call (no sdk.KeyBatcher)")
	}
	ws := []sdk.Window{
		{Region: e.DstID, Offset: batchOff, Length: batchLen},
		{Region: e.DstID + 1000, Offset: 0, Length: batchLen}, // not registered
		{Region: e.DstID, Offset: batchOff + 2*batchLen, Length: batchLen},
	}
	for _, w := range []sdk.Window{ws[0], ws[2]} {
		clear(e.Dst.Bytes()[w.Offset : w.Offset+w.Length])
	}
	g := kb.GrantMany(ctx, ws)
	switch {
	case len(g) != len(ws):
		return fmt.Errorf("GrantMany answered %d items for %d windows", len(g), len(ws))
	case g[0].Err != nil || g[2].Err != nil:
		return fmt.Errorf("GrantMany refused a good window beside a bad one: %v / %v", g[0].Err, g[2].Err)
	case g[1].Err == nil:
		return fmt.Errorf("GrantMany granted key %#x over a region that is not registered", g[1].Key)
	}
	keys := []sdk.Key{g[0].Key, g[2].Key}
	for i, k := range keys {
		c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 0, 0, batchLen))
		if err != nil {
			return err
		}
		if c.Status != sdk.Succeeded {
			return fmt.Errorf("write under batch-granted key %d: %v (%s)", i, c.Status, c.Detail)
		}
	}
	return checkBatchRevoke(ctx, e, kb, keys)
}

// checkBatchRevoke revokes keys with an unknown key between them.
func checkBatchRevoke(ctx context.Context, e *Env, kb sdk.KeyBatcher, keys []sdk.Key) error {
	unknown := sdk.Key(0x0bad0bad0bad0bad)
	r := kb.RevokeMany(ctx, []sdk.Key{keys[0], unknown, keys[1]})
	switch {
	case len(r) != 3:
		return fmt.Errorf("RevokeMany answered %d items for 3 keys", len(r))
	case r[1].Err == nil:
		return fmt.Errorf("RevokeMany reported an unknown key revoked: a partly failed batch reported as complete")
	case r[0].Err != nil || r[2].Err != nil:
		return fmt.Errorf("RevokeMany did not revoke live keys beside an unknown one: %v / %v", r[0].Err, r[2].Err)
	}
	snapshot := append([]byte(nil), e.Dst.Bytes()[batchOff:batchOff+3*batchLen]...)
	for i, k := range keys {
		c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 4096, 0, batchLen))
		if err != nil {
			return err
		}
		if c.Status == sdk.Succeeded {
			return fmt.Errorf("write under key %d after RevokeMany reported it revoked: Succeeded", i)
		}
	}
	if !bytes.Equal(snapshot, e.Dst.Bytes()[batchOff:batchOff+3*batchLen]) {
		return fmt.Errorf("a write after RevokeMany changed a window it reported revoked")
	}
	return nil
}
