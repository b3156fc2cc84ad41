//go:build !kvfenceunsafe

package nocancel

import "github.com/kvfence/kvfence/sdk"

// unsafeVerdict is nil (the honest Verdict) unless built with -tags
// kvfenceunsafe, so that no release binary can select a broken variant.
func unsafeVerdict(string) func([]Task, bool, bool) (sdk.Completion, bool) { return nil }
