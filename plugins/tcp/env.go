package tcp

import (
	"strconv"
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// maxRevokeGrace bounds KVFENCE_TCP_REVOKE_GRACE.
const maxRevokeGrace = time.Second

// ConfigFromEnv reads a Config from KVFENCE_TCP_* variables (getenv is
// os.Getenv in the plugin binary).
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := Config{ListenAddr: getenv("KVFENCE_TCP_LISTEN")}
	for name, dst := range map[string]*time.Duration{
		"KVFENCE_TCP_ACK_TIMEOUT":         &cfg.AckTimeout,
		"KVFENCE_TCP_WRITE_TTL":           &cfg.WriteTTL,
		"KVFENCE_TCP_CLOCK_SKEW":          &cfg.ClockSkew,
		"KVFENCE_TCP_HANDSHAKE_TIMEOUT":   &cfg.HandshakeTimeout,
		"KVFENCE_TCP_IDLE_TIMEOUT":        &cfg.IdleTimeout,
		"KVFENCE_TCP_FIRST_WRITE_TIMEOUT": &cfg.FirstWriteTimeout,
		"KVFENCE_TCP_REVOKE_GRACE":        &cfg.RevokeGrace,
	} {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return Config{}, errdefs.Errorf(errdefs.InvalidArgument, "%s=%q: not a duration", name, v)
			}
			*dst = d
		}
	}
	if cfg.RevokeGrace > maxRevokeGrace {
		// A revocation waits this long for a write in progress: past a
		// second it only lengthens every fenced hold.
		return Config{}, errdefs.Errorf(errdefs.InvalidArgument, "KVFENCE_TCP_REVOKE_GRACE=%v: at most %v", cfg.RevokeGrace, maxRevokeGrace)
	}
	if v := getenv("KVFENCE_TCP_MAX_CONNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return Config{}, errdefs.Errorf(errdefs.InvalidArgument, "KVFENCE_TCP_MAX_CONNS=%q: not a positive integer", v)
		}
		cfg.MaxConns = n
	}
	return cfg, nil
}
