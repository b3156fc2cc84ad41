//go:build kvfenceunsafe

package nocancel

import (
	"os"

	"github.com/kvfence/kvfence/sdk"
)

// unsafeVerdict is the deliberately broken failed-is-definite variant when
// env says so (tests only): a batch with a FAILED or TIMEOUT task is
// reported FailedDefinite, which is what a plugin that trusts the
// backend's error would do. The fault tests must catch it.
func unsafeVerdict(env string) func([]Task, bool, bool) (sdk.Completion, bool) {
	if env == "" || os.Getenv(env) != "failed-is-definite" {
		return nil
	}
	return func(tasks []Task, confirms, expired bool) (sdk.Completion, bool) {
		c, ok := Verdict(tasks, confirms, expired)
		for _, t := range tasks {
			if ok && (t.State == Failed || t.State == Timeout) {
				c.Status, c.Detail = sdk.FailedDefinite, "UNSAFE: FAILED taken as proof: "+c.Detail
				break
			}
		}
		return c, ok
	}
}
