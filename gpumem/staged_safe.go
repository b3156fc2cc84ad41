//go:build !kvfenceunsafe

package gpumem

// The safe build copies nothing into GPU memory before success.
func startEarlyCopies(*StagedReceiver) {}

// CopiesBeforeSuccess says whether this build is the known-unsafe control
// arm (it is not).
const CopiesBeforeSuccess = false

// freesAtAbort: the safe build gives a direct-mode request's engine pages
// back only once the agent released its exposure.
const freesAtAbort = false
