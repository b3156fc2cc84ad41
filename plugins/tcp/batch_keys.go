package tcp

import (
	"context"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// This file: sdk.KeyBatcher, an exposure's keys granted and revoked in one
// call (one RPC over the plugin boundary instead of one per key).

var _ sdk.KeyBatcher = (*Transport)(nil)

// GrantMany grants each window as Grant does; item i is ws[i]'s outcome.
func (t *Transport) GrantMany(ctx context.Context, ws []sdk.Window) []sdk.Granted {
	out := make([]sdk.Granted, len(ws))
	for i, w := range ws {
		out[i].Key, out[i].Err = t.Grant(ctx, w)
	}
	return out
}

// RevokeMany revokes each key as Revoke does, stopping every key's writes
// before waiting for any, with one grace for all: a batch waits for its
// slowest write in progress, not for the sum. An unknown key is NotFound and revoked nothing.
func (t *Transport) RevokeMany(_ context.Context, keys []sdk.Key) []sdk.Revoked {
	out := make([]sdk.Revoked, len(keys))
	es := make([]*exposure, len(keys))
	t.mu.Lock()
	for i, k := range keys {
		es[i] = t.keys[k]
	}
	t.mu.Unlock()
	for i, e := range es {
		switch {
		case t.cfg.unsafe == unsafeBatchRevokeAllOK && e == nil:
			// KNOWN-UNSAFE: a key it could not revoke reported revoked.
		case e == nil:
			out[i].Err = errdefs.Errorf(errdefs.NotFound, "Revoke: unknown key")
		case t.cfg.unsafe == unsafeApplyAfterRevoke:
			// KNOWN-UNSAFE: claims revocation without enforcing it.
			es[i] = nil
		default:
			e.stop()
		}
	}
	cutAt := time.Now().Add(t.cfg.RevokeGrace)
	for i, e := range es {
		if e != nil {
			out[i].Result = e.stopped(cutAt)
		}
	}
	now := time.Now()
	t.mu.Lock()
	for _, e := range es {
		if e != nil {
			t.noteRevokedLocked(e, now)
		}
	}
	t.mu.Unlock()
	return out
}
