package sdktest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Each check gets a budget of its own: a check that runs after slow ones
// still has all of it (one shared budget failed late checks with "context
// deadline exceeded" on a loaded machine).
func TestEveryCheckHasItsOwnBudget(t *testing.T) {
	const budget = 10 * time.Second
	var left []time.Duration
	slow := func(ctx context.Context, _ *Env) error {
		d, ok := ctx.Deadline()
		if !ok {
			return fmt.Errorf("a check without a deadline")
		}
		left = append(left, time.Until(d))
		time.Sleep(200 * time.Millisecond) // an earlier check using its time
		return nil
	}
	runChecks(t, nil, []Check{{Name: "a", Run: slow}, {Name: "b", Run: slow}, {Name: "c", Run: slow}}, budget)
	for i, l := range left {
		if l < budget-100*time.Millisecond {
			t.Errorf("check %d started with %v of a %v budget", i, l.Round(time.Millisecond), budget)
		}
	}
}
