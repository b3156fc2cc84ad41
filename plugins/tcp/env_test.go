package tcp

import (
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// KVFENCE_TCP_REVOKE_GRACE refuses what is not a duration, negative, or
// longer than a second (every fenced hold would wait it out); zero takes
// the default.
func TestRevokeGraceFromEnv(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 20 * time.Millisecond, "0": 20 * time.Millisecond, "5ms": 5 * time.Millisecond, "1s": time.Second} {
		cfg, err := ConfigFromEnv(func(k string) string {
			if k == "KVFENCE_TCP_REVOKE_GRACE" {
				return v
			}
			return ""
		})
		if got := cfg.withDefaults().RevokeGrace; err != nil || got != want {
			t.Errorf("KVFENCE_TCP_REVOKE_GRACE=%q: %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"-1ms", "2s", "1000h", "soon", "NaN"} {
		_, err := ConfigFromEnv(func(k string) string {
			if k == "KVFENCE_TCP_REVOKE_GRACE" {
				return v
			}
			return ""
		})
		if !errdefs.Is(err, errdefs.InvalidArgument) {
			t.Errorf("KVFENCE_TCP_REVOKE_GRACE=%q: %v, want InvalidArgument", v, err)
		}
	}
}
