package sdktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// ErrNotApplicable wraps the answer of a check whose promise concerns a
// capability the transport does not declare: RunContract skips it, the
// conformance suite reports it "not applicable" (no profile requires it).
var ErrNotApplicable = errors.New("not applicable")

func notApplicable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotApplicable, fmt.Sprintf(format, args...))
}

// The shape checkKeyBounds grants: four slots of two shards; the key is the
// first shard of each slot (a rank at shard position 0 of a run of 4).
const (
	boundsOff    = 640 << 10
	boundsShard  = 4096
	boundsStride = 2 * boundsShard
	boundsSlots  = 4
	boundsFill   = 0x5A
)

// checkKeyBounds holds a transport to its Capabilities.Bounds: a write
// under a key lands only where the key's window covers it. With pieces, a
// pieced key's own pieces take writes and every byte between them (another
// rank's shard) stays untouched whatever the holder writes there; with
// window, a pieced Grant is refused (never granted as the whole span) and
// a contiguous key reaches no byte of its neighbour's window.
func checkKeyBounds(ctx context.Context, e *Env) error {
	switch e.Info.Capabilities.Bounds {
	case sdk.BoundsNone:
		return notApplicable("the transport declares bounds none (it does not say its receiver confines writes to a key's window)")
	case sdk.BoundsWindow:
		return checkWindowBounds(ctx, e)
	case sdk.BoundsPieces:
		return checkPieceBounds(ctx, e)
	}
	return fmt.Errorf("Info: unknown bounds %v", e.Info.Capabilities.Bounds)
}

func (e *Env) fillBounds() []byte {
	mem := e.Dst.Bytes()[boundsOff : boundsOff+boundsSlots*boundsStride]
	for i := range mem {
		mem[i] = boundsFill
	}
	return mem
}

// refusedWrite posts a write that must not land and says why it failed
// the check, if it did.
func (e *Env) refusedWrite(ctx context.Context, k sdk.Key, srcOff, off, n uint64, what string) error {
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, srcOff, off, n))
	switch {
	case err != nil && errdefs.ClassOf(err) != errdefs.InvalidArgument:
		return fmt.Errorf("%s refused at Post with class %v, want invalid-argument", what, errdefs.ClassOf(err))
	case err == nil && c.Status == sdk.Succeeded:
		return fmt.Errorf("%s reported Succeeded", what)
	}
	return nil
}

func checkPieceBounds(ctx context.Context, e *Env) error {
	mem := e.fillBounds()
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: boundsOff,
		Length: (boundsSlots-1)*boundsStride + boundsShard, Stride: boundsStride, Piece: boundsShard})
	if err != nil {
		return fmt.Errorf("Grant of a pieced window (the transport declares pieces): %w", err)
	}
	defer func() { _, _ = e.Granter.Revoke(ctx, k) }()
	// The key's own piece in slot 1 takes a write.
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 0, boundsStride, boundsShard))
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded || !bytes.Equal(mem[boundsStride:boundsStride+boundsShard], e.Src.Bytes()[:boundsShard]) {
		return fmt.Errorf("write inside the key's own piece: %v (%s), want Succeeded and the bytes in place", c.Status, c.Detail)
	}
	for s := uint64(0); s+1 < boundsSlots; s++ {
		gap := s*boundsStride + boundsShard
		if err := e.refusedWrite(ctx, k, boundsShard, gap, boundsShard, fmt.Sprintf("write into the gap after piece %d (another shard)", s)); err != nil {
			return err
		}
	}
	if err := e.refusedWrite(ctx, k, boundsShard, boundsShard/2, boundsShard, "write straddling a piece's end"); err != nil {
		return err
	}
	for s := uint64(0); s < boundsSlots; s++ {
		gap := mem[s*boundsStride+boundsShard : (s+1)*boundsStride]
		if err := untouched(gap, boundsFill); err != nil {
			return fmt.Errorf("the shard after piece %d, outside the key: %w", s, err)
		}
		if s != 1 {
			if err := untouched(mem[s*boundsStride:s*boundsStride+boundsShard], boundsFill); err != nil {
				return fmt.Errorf("piece %d, never written: %w", s, err)
			}
		}
	}
	return nil
}

func checkWindowBounds(ctx context.Context, e *Env) error {
	mem := e.fillBounds()
	pieced := sdk.Window{Region: e.DstID, Offset: boundsOff, Length: boundsStride + boundsShard, Stride: boundsStride, Piece: boundsShard}
	if k, err := e.Granter.Grant(ctx, pieced); err == nil {
		_, _ = e.Granter.Revoke(ctx, k)
		return fmt.Errorf("a transport declaring bounds window granted a pieced window (it would expose the whole span)")
	} else if !errdefs.Is(err, errdefs.Unimplemented) {
		return fmt.Errorf("pieced Grant to a window-bounded transport: %v, want unimplemented", err)
	}
	// A rank's key over its own shard, its neighbour's shard right after.
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: boundsOff, Length: boundsShard})
	if err != nil {
		return fmt.Errorf("Grant: %w", err)
	}
	defer func() { _, _ = e.Granter.Revoke(ctx, k) }()
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 0, 0, boundsShard))
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded || !bytes.Equal(mem[:boundsShard], e.Src.Bytes()[:boundsShard]) {
		return fmt.Errorf("write inside the key's window: %v (%s), want Succeeded and the bytes in place", c.Status, c.Detail)
	}
	if err := e.refusedWrite(ctx, k, boundsShard, boundsShard, boundsShard, "write at the next shard (outside the key)"); err != nil {
		return err
	}
	return untouched(mem[boundsShard:], boundsFill)
}
