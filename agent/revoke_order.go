package agent

import (
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
)

// RevokeOrder says when decode revokes an aborted exposure's keys: at the
// abort, while the request's writes may still arrive (holds end at once,
// the late writes are refused), or after every writer drained (no write is
// refused; the slots wait for the slowest rank's acknowledgement).
type RevokeOrder uint8

const (
	// RevokeAuto (the default): at the abort where the transport declares
	// sdk.Capabilities.RefusalsIsolated, else after the drain. A refused
	// write must fail alone: on a transport where it fails its whole
	// connection or queue pair (verbs), revoking at the abort would fail
	// other requests' writes beside the late one. The writers' side counts
	// too: an exposure written by a prefill rank whose transport does not
	// declare it (an older plugin, whose refused session failed every batch
	// queued on it) is revoked after its drain.
	RevokeAuto RevokeOrder = iota
	// RevokeAtAbort: at the abort, whatever the transports declare.
	RevokeAtAbort
	// RevokeAfterDrain: only after every writer drained.
	RevokeAfterDrain
)

var revokeOrderNames = []string{"auto", "at-abort", "after-drain"}

func (o RevokeOrder) String() string {
	if int(o) < len(revokeOrderNames) {
		return revokeOrderNames[o]
	}
	return fmt.Sprintf("RevokeOrder(%d)", o)
}

// ParseRevokeOrder reads "auto", "at-abort" or "after-drain".
func ParseRevokeOrder(s string) (RevokeOrder, error) {
	for i, n := range revokeOrderNames {
		if s == n {
			return RevokeOrder(i), nil
		}
	}
	return 0, errdefs.Errorf(errdefs.InvalidArgument, "revoke order %q: want auto, at-abort or after-drain", s)
}

// revokesAtAbort resolves o against what the transport declares.
func (o RevokeOrder) revokesAtAbort(refusalsIsolated bool) bool {
	switch o {
	case RevokeAtAbort:
		return true
	case RevokeAfterDrain:
		return false
	}
	return refusalsIsolated
}
