package nixl

import (
	"testing"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// The real C API (nixl 8770b655) has two codes past EXCEPTION: NO_TELEMETRY
// (-5) and NOT_FOUND (-6, metadata not loaded or no backend serves the
// request). They are named, NOT_FOUND is classified as such, and as task
// statuses both stay errors (InDoubt), never success.
func TestNewerErrorCodes(t *testing.T) {
	if got := statusName(-6); got != "ERROR_NOT_FOUND (-6)" {
		t.Errorf("statusName(-6) = %q", got)
	}
	if got := statusName(-5); got != "ERROR_NO_TELEMETRY (-5)" {
		t.Errorf("statusName(-5) = %q", got)
	}
	if got := classOf(-6); got != errdefs.NotFound {
		t.Errorf("classOf(-6) = %v, want not-found", got)
	}
	for _, c := range []int{-5, -6, -7} {
		if s := StateOf(c); s != nocancel.Failed {
			t.Errorf("StateOf(%d) = %v, want Failed", c, s)
		}
	}
}
