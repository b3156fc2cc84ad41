package knownunsafe

import (
	"strings"
	"testing"
	"time"
)

// In a default build no name reaches an agent's core; with the tag every
// known name does. Either way "safe" and "" are the real core, and unknown
// names are refused with the list.
func TestForAgentsFollowsTheBuildTag(t *testing.T) {
	for _, v := range All {
		err := SelectForAgents(v.Name())
		switch {
		case Compiled && err != nil:
			t.Errorf("tagged build refused %s: %v", v.Name(), err)
		case !Compiled && (err == nil || !strings.Contains(err.Error(), "-tags kvfenceunsafe")):
			t.Errorf("default build: %s gave %v", v.Name(), err)
		case !Compiled && !AgentVariant().IsSafe():
			t.Errorf("default build runs %s", AgentVariant().Name())
		}
	}
	for _, n := range []string{"", "safe"} {
		if v, err := ForAgents(n); err != nil || !v.IsSafe() {
			t.Errorf("%q: %v %v", n, v.Name(), err)
		}
	}
	if _, err := ForAgents("no-such"); err == nil || !strings.Contains(err.Error(), "release-on-abort") {
		t.Errorf("unknown name: %v", err)
	}
	_ = SelectForAgents("safe")
}

// The self-renewed lease travels in the variant, and only that variant
// takes one.
func TestSelfLeaseLivesInTheVariant(t *testing.T) {
	v := SelfRenewedLease.WithSelfLease(3 * time.Second)
	if !v.Is(SelfRenewedLease) || v.SelfLease() != 3*time.Second || v.Name() != "self-renewed-lease" {
		t.Fatalf("self-renewed-lease with a lease: %+v", v)
	}
	if w := ReleaseOnAbort.WithSelfLease(time.Second); w != ReleaseOnAbort {
		t.Fatalf("another variant took a lease: %+v", w)
	}
}
