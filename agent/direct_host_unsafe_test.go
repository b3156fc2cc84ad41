//go:build kvfenceunsafe

package agent

import (
	"testing"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

// TestDirectHostLandingControlReleaseOnAbort is the control arm of
// TestDirectHostLandingAbortInFlight: the known-unsafe core frees a
// request's pages (its host landing page included) at abort, so the next
// request is lent them while the aborted batch is in flight, and the late
// write lands in them
// (go test -tags kvfenceunsafe ./agent -run ControlReleaseOnAbort).
func TestDirectHostLandingControlReleaseOnAbort(t *testing.T) {
	if err := knownunsafe.SelectForAgents(knownunsafe.ReleaseOnAbort.Name()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = knownunsafe.SelectForAgents("safe") })
	run := landingAbort(t)
	t.Logf("early admission %v, aborted bytes in the next owner's engine pages %d and landing pages %d", run.early, run.lateKV, run.lateLanding)
	if !run.early || run.lateLanding == 0 {
		t.Fatal("control arm (landing pages free at abort) not caught: no late write reached a landing page lent again")
	}
	t.Logf("control arm caught: the aborted request's late write reached the host landing page lent to the next request")
}
