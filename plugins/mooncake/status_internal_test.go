package mooncake

import (
	"strings"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
)

// The C API returns Status::Code (positive) from submitTransfer and
// error.h's negative codes elsewhere; the two differ past -8.
func TestReturnCodes(t *testing.T) {
	cases := []struct {
		rc    int
		name  string
		class errdefs.Class
	}{
		{3, "AddressNotRegistered", errdefs.InvalidArgument},
		{-3, "ERR_ADDRESS_NOT_REGISTERED", errdefs.InvalidArgument},
		{999, "NotImplemented", errdefs.Unimplemented},
		{-303, "ERR_NOT_IMPLEMENTED", errdefs.Unimplemented},
		{-302, "ERR_MEMORY", errdefs.ResourceExhausted},
		{-103, "ERR_MALFORMED_JSON", errdefs.InvalidArgument},
		{-202, "ERR_CONTEXT", errdefs.Unavailable},
		{-999, "rc -999", errdefs.Unavailable},
		{4, "BatchBusy", errdefs.Unavailable},
	}
	for _, c := range cases {
		if got := rcName(c.rc); !strings.Contains(got, c.name) {
			t.Errorf("rcName(%d) = %q, want %q", c.rc, got, c.name)
		}
		if got := classOf(c.rc); got != c.class {
			t.Errorf("classOf(%d) = %v, want %v", c.rc, got, c.class)
		}
	}
}
