package sdk

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
)

// Bounds is how far a receiving transport holds a write to the bytes its
// key grants, enforced on the receiving side (a sender-side check proves
// nothing about a hostile writer).
type Bounds uint8

const (
	// BoundsNone: the transport does not say that it enforces its windows
	// on the receiving side (what an older plugin reads as). A holder of
	// any key may be able to write anywhere the backend lets it.
	BoundsNone Bounds = 0
	// BoundsWindow: a write under a key lands only inside the key's
	// contiguous window, or is refused. Pieced windows are refused.
	BoundsWindow Bounds = 1
	// BoundsPieces: as BoundsWindow, and pieced windows (Window.Stride,
	// Window.Piece) are enforced piece by piece.
	BoundsPieces Bounds = 2
)

func (b Bounds) String() string {
	switch b {
	case BoundsNone:
		return "none"
	case BoundsWindow:
		return "window"
	case BoundsPieces:
		return "pieces"
	}
	return fmt.Sprintf("bounds(%d)", uint8(b))
}

// Pieced says whether the window grants pieces rather than every byte.
func (w Window) Pieced() bool { return w.Stride != 0 }

// Check refuses a window whose shape means nothing (InvalidArgument): a
// zero length, an end past 2^64, a piece of zero bytes or longer than its
// stride, or a Piece without a Stride.
func (w Window) Check() error {
	switch {
	case w.Length == 0:
		return errdefs.Errorf(errdefs.InvalidArgument, "window: zero length")
	case w.Offset+w.Length < w.Offset:
		return errdefs.Errorf(errdefs.InvalidArgument, "window: [%d,+%d) wraps past 2^64", w.Offset, w.Length)
	case w.Stride == 0 && w.Piece != 0:
		return errdefs.Errorf(errdefs.InvalidArgument, "window: piece %d without a stride", w.Piece)
	case w.Stride != 0 && (w.Piece == 0 || w.Piece > w.Stride):
		return errdefs.Errorf(errdefs.InvalidArgument, "window: piece %d must be 1..stride (%d)", w.Piece, w.Stride)
	}
	return nil
}

// Covers says whether a write of n bytes at window offset off may land:
// inside the window and, for a pieced window, inside one piece.
func (w Window) Covers(off, n uint64) bool {
	if n == 0 || off+n < off || off+n > w.Length {
		return false
	}
	if w.Stride == 0 {
		return true
	}
	return off%w.Stride+n <= w.Piece
}

// refusePieced is the sdk's own guard at the plugin boundary: a pieced
// window may go only to a transport that declares it enforces pieces.
func refusePieced(w Window, b Bounds) error {
	if w.Pieced() && b != BoundsPieces {
		return errdefs.Errorf(errdefs.Unimplemented, "Grant: a pieced window (stride %d, piece %d) needs a transport that enforces pieces; this one declares bounds %s", w.Stride, w.Piece, b)
	}
	return nil
}
