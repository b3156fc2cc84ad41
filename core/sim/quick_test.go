package sim

import (
	"testing"

	"github.com/kvfence/kvfence/internal/knownunsafe"
)

func TestQuickSafe(t *testing.T) {
	s := Sweep(knownunsafe.Safe, 1, 3000, true)
	t.Logf("%+v", s)
	if s.First != nil {
		t.Fatal(s.First)
	}
}

func TestQuickVariants(t *testing.T) {
	for _, v := range knownunsafe.All {
		s := Sweep(v, 1, 3000, true)
		if s.First == nil {
			t.Errorf("%s: no violation in %d seeds", v.Name(), s.Seeds)
			continue
		}
		t.Logf("%s: caught at seed %d: %s %s", v.Name(), s.First.Seed, s.First.Invariant, s.First.What)
	}
}
