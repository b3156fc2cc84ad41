package sdk

import (
	"context"

	"github.com/kvfence/kvfence/errdefs"
	pb "github.com/kvfence/kvfence/sdk/proto/kvfence/transport/v1"
)

// This file: KeyBatcher over the plugin boundary, one RPC per batch
// (batch_keys.go has the contract). Wire compatibility both ways: a host
// sees KeyBatcher only on a plugin whose Info says batch_keys (an older
// plugin does not, and gets single calls); an older host never calls the
// batch RPCs.

// remoteBatchGranter is a remoteGranter whose plugin serves the batch RPCs.
type remoteBatchGranter struct{ *remoteGranter }

// GrantMany refuses pieced windows to a plugin without pieces before they
// leave the host (as Grant does); the rest go in one call. A call that fails
// as a whole fails every item sent: the plugin may have made some of those
// keys, which then live until their region is deregistered (leaked state,
// never a key the host uses).
func (r *remoteBatchGranter) GrantMany(ctx context.Context, ws []Window) []Granted {
	out := make([]Granted, len(ws))
	req := &pb.GrantManyRequest{}
	var sent []int
	for i, w := range ws {
		if err := refusePieced(w, r.info.Capabilities.Bounds); err != nil {
			out[i].Err = err
			continue
		}
		req.Windows = append(req.Windows, windowToPB(w))
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return out
	}
	res, err := r.rpc.GrantMany(ctx, req)
	items := res.GetItems()
	for j, i := range sent {
		switch {
		case err != nil:
			out[i].Err = fromStatusError(err)
		case j >= len(items):
			out[i].Err = errdefs.Errorf(errdefs.Internal, "GrantMany: the plugin answered %d of %d items", len(items), len(sent))
		default:
			out[i].Key, out[i].Err = Key(items[j].GetKey()), itemError(items[j].GetErrorClass(), items[j].GetDetail())
		}
	}
	return out
}

// RevokeMany sends every key in one call. A key counts as revoked only if
// its item says revoked with no error: a call that fails as a whole, an
// item left out, or one that says both revoked and failed, revoked nothing
// the host may rely on.
func (r *remoteBatchGranter) RevokeMany(ctx context.Context, keys []Key) []Revoked {
	req := &pb.RevokeManyRequest{Keys: make([]uint64, len(keys))}
	for i, k := range keys {
		req.Keys[i] = uint64(k)
	}
	res, err := r.rpc.RevokeMany(ctx, req)
	items := res.GetItems()
	out := make([]Revoked, len(keys))
	for i := range out {
		switch {
		case err != nil:
			out[i].Err = fromStatusError(err)
		case i >= len(items):
			out[i].Err = errdefs.Errorf(errdefs.Internal, "RevokeMany: the plugin answered %d of %d items: key not revoked", len(items), len(keys))
		case items[i].GetErrorClass() != 0:
			out[i].Err = itemError(items[i].GetErrorClass(), items[i].GetDetail())
		case !items[i].GetRevoked():
			out[i].Err = errdefs.Errorf(errdefs.Internal, "RevokeMany: the plugin did not say key %d was revoked", keys[i])
		default:
			out[i].Result = RevokeResult{WritesApplied: items[i].GetWritesApplied(), WritesDropped: items[i].GetWritesDropped()}
		}
	}
	return out
}

// itemError is a batch item's classified error, nil for class 0. A class
// this host does not know reads as Unknown, still an error.
func itemError(class uint32, detail string) error {
	if class == 0 {
		return nil
	}
	c := errdefs.Class(class)
	if class >= uint32(len(errdefs.Classes)) {
		c = errdefs.Unknown
	}
	return errdefs.Errorf(c, "%s", detail)
}

// itemClass is the wire form of a batch item's error: its class, and a
// class that is not 0 even for an unclassified error.
func itemClass(err error) (uint32, string) {
	if err == nil {
		return 0, ""
	}
	c := errdefs.ClassOf(err)
	if c == errdefs.Unknown {
		c = errdefs.Internal
	}
	return uint32(c), err.Error()
}

// GrantMany serves a batch grant: with the plugin's KeyBatcher, or one
// Grant per item. Pieced windows are refused per item to a plugin that does
// not enforce pieces (the plugin's side of the guard, as in Grant).
func (s *grpcServer) GrantMany(ctx context.Context, r *pb.GrantManyRequest) (*pb.GrantManyResponse, error) {
	g, ok := s.impl.(Granter)
	if !ok {
		return nil, fail(ctx, errdefs.Errorf(errdefs.Unimplemented, "GrantMany: transport cannot revoke"))
	}
	out := make([]Granted, len(r.GetWindows()))
	var ws []Window
	var idx []int
	bounds := BoundsNone
	for i, pw := range r.GetWindows() {
		w := windowFromPB(pw)
		if w.Pieced() && bounds != BoundsPieces {
			info, err := s.impl.Info(ctx)
			if err != nil {
				return nil, fail(ctx, err)
			}
			bounds = info.Capabilities.Bounds
		}
		if out[i].Err = refusePieced(w, bounds); out[i].Err == nil {
			ws, idx = append(ws, w), append(idx, i)
		}
	}
	for j, gr := range GrantKeys(ctx, g, ws) {
		out[idx[j]] = gr
	}
	res := &pb.GrantManyResponse{Items: make([]*pb.GrantItem, len(out))}
	for i, gr := range out {
		class, detail := itemClass(gr.Err)
		res.Items[i] = &pb.GrantItem{ErrorClass: class, Detail: detail}
		if gr.Err == nil {
			res.Items[i].Key = uint64(gr.Key)
		}
	}
	return res, nil
}

// RevokeMany serves a batch revocation: revoked is set only for an item
// whose revocation returned no error.
func (s *grpcServer) RevokeMany(ctx context.Context, r *pb.RevokeManyRequest) (*pb.RevokeManyResponse, error) {
	g, ok := s.impl.(Granter)
	if !ok {
		return nil, fail(ctx, errdefs.Errorf(errdefs.Unimplemented, "RevokeMany: transport cannot revoke"))
	}
	keys := make([]Key, len(r.GetKeys()))
	for i, k := range r.GetKeys() {
		keys[i] = Key(k)
	}
	res := &pb.RevokeManyResponse{Items: make([]*pb.RevokeItem, len(keys))}
	for i, rv := range RevokeKeys(ctx, g, keys) {
		class, detail := itemClass(rv.Err)
		res.Items[i] = &pb.RevokeItem{Revoked: rv.Err == nil, ErrorClass: class, Detail: detail,
			WritesApplied: rv.Result.WritesApplied, WritesDropped: rv.Result.WritesDropped}
	}
	return res, nil
}
