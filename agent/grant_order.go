//go:build !kvfenceunsafe

package agent

// revokeWaitsForGrants: a revoke the core asks for while an exposure's
// Grants are in flight waits for them (decode.go revoke), so Revoked
// covers every key the exposure ever had. Always, in a default build.
func revokeWaitsForGrants() bool { return true }
