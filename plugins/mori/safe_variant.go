//go:build !kvfenceunsafe

package mori

import (
	"github.com/kvfence/kvfence/plugins/internal/nocancel"
	"github.com/kvfence/kvfence/sdk"
)

// unsafeVerdict is nil (the honest Verdict) unless built with -tags
// kvfenceunsafe, so that no release binary can select a broken variant.
func unsafeVerdict() func([]nocancel.Task, bool, bool) (sdk.Completion, bool) { return nil }
