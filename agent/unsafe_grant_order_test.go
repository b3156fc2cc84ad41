//go:build kvfenceunsafe

package agent

import "testing"

// The control arm of TestRevokeWaitsForGrantsInFlight: with the revoke not
// waiting for the Grants in flight, the slots go back before any key over
// them exists (go test -tags kvfenceunsafe ./agent -run GrantsControl).
func TestRevokeBeforeGrantsControl(t *testing.T) {
	unsafeRevokeBeforeGrants.Store(true)
	t.Cleanup(func() { unsafeRevokeBeforeGrants.Store(false) })
	if early, _, _ := grantRace(t); !early {
		t.Fatal("the unsafe arm kept the slots until its Grants were done: the test cannot tell it apart")
	}
}
