package sdk

import (
	"context"
	"sync"

	"github.com/kvfence/kvfence/errdefs"
)

// This file: grants and revocations of many keys in one call (issue 21).
// A receiver grants an exposure's keys together and revokes them together;
// over the plugin boundary one call per key costs a gRPC round trip each,
// which is most of what the per-exposure fence costs (docs/fence-cost.md).

// KeyBatcher is the optional capability behind Capabilities.BatchKeys:
// Grant and Revoke for many keys in one call. A transport that implements
// it also implements Granter, and each item means exactly what the single
// call would: GrantMany's item i is what Grant(ws[i]) would have answered,
// RevokeMany's item i what Revoke(keys[i]) would have.
//
// The calls never fail as a whole: they answer every item, in order, and
// the items are independent (one that fails does not stop the others).
// What failed as a whole (the transport closed, the context expired) is
// each unanswered item's error. The safety rule is on RevokeMany: an item
// whose Err is nil says no byte under that key lands any more — exactly
// Revoke's promise — and an item whose revocation did not take effect, or
// whose outcome the transport does not know, must carry an error. Never
// report a partly failed batch as revoked. A GrantMany item with an error
// granted nothing.
//
// Hosts call GrantKeys and RevokeKeys, which use a KeyBatcher when the
// transport has one and Grant and Revoke once per key otherwise.
type KeyBatcher interface {
	Granter
	GrantMany(ctx context.Context, ws []Window) []Granted
	RevokeMany(ctx context.Context, keys []Key) []Revoked
}

// Granted is one item of a batch grant: Key is granted iff Err is nil.
type Granted struct {
	Key Key
	Err error
}

// Revoked is one item of a batch revocation: the key is revoked (no byte
// under it lands any more) iff Err is nil.
type Revoked struct {
	Result RevokeResult
	Err    error
}

// GrantKeys grants every window of ws, in one call when g is a KeyBatcher
// and one call per window (in parallel) when it is not, or when the batch
// call is not implemented after all. Item i is the outcome of ws[i].
func GrantKeys(ctx context.Context, g Granter, ws []Window) []Granted {
	if len(ws) == 0 {
		return nil
	}
	if kb, ok := g.(KeyBatcher); ok {
		if out := checkGranted(kb.GrantMany(ctx, ws), len(ws)); !allUnimplemented(len(out), func(i int) error { return out[i].Err }) {
			return out
		}
	}
	out := make([]Granted, len(ws))
	each(len(ws), func(i int) {
		out[i].Key, out[i].Err = g.Grant(ctx, ws[i])
	})
	return checkGranted(out, len(ws))
}

// RevokeKeys revokes every key of keys, like GrantKeys. Item i is revoked
// iff its Err is nil; an item a batch answer left out is not revoked.
func RevokeKeys(ctx context.Context, g Granter, keys []Key) []Revoked {
	if len(keys) == 0 {
		return nil
	}
	if kb, ok := g.(KeyBatcher); ok {
		if out := checkRevoked(kb.RevokeMany(ctx, keys), len(keys)); !allUnimplemented(len(out), func(i int) error { return out[i].Err }) {
			return out
		}
	}
	out := make([]Revoked, len(keys))
	each(len(keys), func(i int) {
		out[i].Result, out[i].Err = g.Revoke(ctx, keys[i])
	})
	return out
}

// each runs f(0..n-1): inline for one, in parallel for more (the single
// calls of a host without batches went out in parallel before, too).
func each(n int, f func(i int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

// checkGranted holds a batch answer to the contract: exactly n items, and
// no item granted under the zero key. What is missing granted nothing.
func checkGranted(got []Granted, n int) []Granted {
	out := make([]Granted, n)
	for i := range out {
		switch {
		case i >= len(got):
			out[i].Err = errdefs.Errorf(errdefs.Internal, "GrantMany: the transport answered %d of %d items", len(got), n)
		case got[i].Err == nil && got[i].Key == 0:
			out[i].Err = errdefs.Errorf(errdefs.Internal, "GrantMany: item %d granted the zero key", i)
		default:
			out[i] = got[i]
		}
	}
	return out
}

// checkRevoked: exactly n items; one the answer left out is not revoked.
func checkRevoked(got []Revoked, n int) []Revoked {
	out := make([]Revoked, n)
	for i := range out {
		if i >= len(got) {
			out[i].Err = errdefs.Errorf(errdefs.Internal, "RevokeMany: the transport answered %d of %d items: item %d is not revoked", len(got), n, i)
			continue
		}
		out[i] = got[i]
	}
	return out
}

// allUnimplemented: every item failed Unimplemented, as a batch call to a
// plugin that does not serve it fails (then the single calls are tried).
func allUnimplemented(n int, errOf func(i int) error) bool {
	for i := range n {
		if !errdefs.Is(errOf(i), errdefs.Unimplemented) {
			return false
		}
	}
	return n > 0
}
