package mooncake

import (
	"strings"
	"testing"

	"github.com/kvfence/kvfence/sdk"
)

// The C API returns Status::Code (positive) from submitTransfer and
// error.h's negative codes elsewhere; the two differ past -8.
func TestReturnCodes(t *testing.T) {
	cases := []struct {
		rc    int
		name  string
		class sdk.Class
	}{
		{3, "AddressNotRegistered", sdk.ClassInvalidArgument},
		{-3, "ERR_ADDRESS_NOT_REGISTERED", sdk.ClassInvalidArgument},
		{999, "NotImplemented", sdk.ClassUnimplemented},
		{-303, "ERR_NOT_IMPLEMENTED", sdk.ClassUnimplemented},
		{-302, "ERR_MEMORY", sdk.ClassResourceExhausted},
		{-103, "ERR_MALFORMED_JSON", sdk.ClassInvalidArgument},
		{-202, "ERR_CONTEXT", sdk.ClassUnavailable},
		{-999, "rc -999", sdk.ClassUnavailable},
		{4, "BatchBusy", sdk.ClassUnavailable},
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
