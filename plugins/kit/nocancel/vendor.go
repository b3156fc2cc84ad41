package nocancel

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/errdefs"
)

// What the vendor plugins (mooncake, nixl, mori) share around this
// transport: their limits, their unbounded tail, and how they read a
// duration from their environment.

// Limits every vendor plugin declares (their C APIs have no limits call;
// these keep one batch's bookkeeping small and one op within what a TCP
// slice handles).
const (
	vendorMaxBatch   = 1024
	vendorMaxOpBytes = 1 << 30
)

// Vendor is what a vendor plugin passes to NewVendor.
type Vendor struct {
	Name        string // for errors: "mooncake", "nixl", "mori"
	DirListen   string // Config.DirListen
	ReportAfter time.Duration
	// UnsafeEnv names the variable that selects a deliberately broken
	// variant in a build with -tags kvfenceunsafe (tests only; a default
	// build ignores it): failed-is-definite, or succeed-early-after:N.
	UnsafeEnv string
}

// NewVendor builds a vendor plugin's transport over its loaded backend,
// with an unbounded MaxTail: none of these backends bounds how long a
// write to a stopped target may still land.
func NewVendor(v Vendor, be Backend, log hclog.Logger) (*Transport, error) {
	if be == nil {
		return nil, fmt.Errorf("%s: no backend", v.Name)
	}
	return New(Config{Backend: be, MaxTail: UnboundedTail, MaxBatch: vendorMaxBatch, MaxOpBytes: vendorMaxOpBytes,
		DirListen: v.DirListen, ReportAfter: v.ReportAfter, Verdict: unsafeVerdict(v.UnsafeEnv), Logger: log,
		lieAfter: unsafeLieAfter(v.UnsafeEnv)})
}

// PositiveDurationEnv reads key as a positive duration, def when unset; a
// bad value is InvalidArgument naming the variable.
func PositiveDurationEnv(getenv func(string) string, key string, def time.Duration) (time.Duration, error) {
	v := getenv(key)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return def, errdefs.Errorf(errdefs.InvalidArgument, "%s=%q: want a positive duration", key, v)
	}
	return d, nil
}
