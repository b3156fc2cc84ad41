//go:build !kvfenceunsafe

package nocancel

import "github.com/kvfence/kvfence/sdk"

// unsafeVerdict is nil (the honest Verdict) unless built with -tags
// kvfenceunsafe, so that no release binary can select a broken variant.
func unsafeVerdict(string) func([]Task, bool, bool) (sdk.Completion, bool) { return nil }

// unsafeLieAfter is 0 (never lie) unless built with -tags kvfenceunsafe.
func unsafeLieAfter(string) int { return 0 }

// lieEarly is the honest path unless built with -tags kvfenceunsafe.
func (t *Transport) lieEarly(*batch, []Write) bool { return false }
