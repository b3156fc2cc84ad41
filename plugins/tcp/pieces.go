package tcp

import "github.com/kvfence/kvfence/sdk"

// This file: how far a write under a key may reach (Capabilities.Bounds
// = pieces). A key's window may be pieced (sdk.Window.Stride/Piece: one
// prefill rank's shard in each slot of a run); the receiver checks every
// write's range against the key's own window, piece by piece, before it
// reads a byte of the payload, so a co-rank holding the key cannot write
// the shards between its pieces.

// keyBounds is what this transport declares.
const keyBounds = sdk.BoundsPieces

// setWindow fixes what e's key may write, from a checked window.
func (e *exposure) setWindow(w sdk.Window) {
	e.stride, e.piece = w.Stride, w.Piece
}

// admits says whether a write of n bytes at window offset off may land
// under e's key. ignorePieces is the known-unsafe variant: it checks the
// window's span only, so a pieced key reaches every shard of its run.
func (e *exposure) admits(off, n uint64, ignorePieces bool) bool {
	w := sdk.Window{Length: e.length, Stride: e.stride, Piece: e.piece}
	if ignorePieces {
		w.Stride, w.Piece = 0, 0
	}
	return w.Covers(off, n)
}
