//go:build kvfenceunsafe

package agent

import "sync/atomic"

// unsafeRevokeBeforeGrants is the known-unsafe control arm of
// TestRevokeWaitsForGrantsInFlight: a revoke asked for while Grants are in
// flight revokes what exists and reports Revoked at once, so the slots go
// back while keys over them are still being made. Only a build with -tags
// kvfenceunsafe has the switch.
var unsafeRevokeBeforeGrants atomic.Bool

func revokeWaitsForGrants() bool { return !unsafeRevokeBeforeGrants.Load() }
