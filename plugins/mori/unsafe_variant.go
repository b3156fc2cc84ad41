//go:build kvfenceunsafe

package mori

import (
	"os"

	"github.com/kvfence/kvfence/plugins/internal/nocancel"
	"github.com/kvfence/kvfence/sdk"
)

// EnvUnsafe selects a deliberately broken variant (tests only):
// failed-is-definite reports a batch with a failed write as FailedDefinite,
// which is what a plugin that trusts MORI's first error would do.
const EnvUnsafe = "KVFENCE_MORI_UNSAFE"

func unsafeVerdict() func([]nocancel.Task, bool, bool) (sdk.Completion, bool) {
	if os.Getenv(EnvUnsafe) != "failed-is-definite" {
		return nil
	}
	return func(tasks []nocancel.Task, confirms, expired bool) (sdk.Completion, bool) {
		c, ok := nocancel.Verdict(tasks, confirms, expired)
		for _, t := range tasks {
			if ok && (t.State == nocancel.Failed || t.State == nocancel.Timeout) {
				c.Status, c.Detail = sdk.FailedDefinite, "UNSAFE: FAILED taken as proof: "+c.Detail
				break
			}
		}
		return c, ok
	}
}
