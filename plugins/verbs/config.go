package verbs

import (
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

// RevokeMode says how Revoke fences an exposure.
type RevokeMode string

const (
	// RevokeAuto picks RevokeMW1 when the device supports memory windows,
	// else RevokeMR.
	RevokeAuto RevokeMode = "auto"
	// RevokeMW1: each exposure is a type-1 memory window bound (ibv_bind_mw)
	// over a per-exposure MR that itself grants no remote access; Revoke
	// unbinds the window (zero-length bind), then frees it and the MR.
	RevokeMW1 RevokeMode = "mw1"
	// RevokeMR: MR rotation. Each exposure is its own MR with remote access
	// (new rkey per grant); Revoke deregisters it.
	RevokeMR RevokeMode = "mr"
)

// PollMode says how the completion loop waits (see poll.go, pollLoop).
type PollMode string

const (
	// PollNap: after 64 empty polls, sleep 50 µs doubling to 1 ms between
	// polls (Go's timers make each such sleep ~1 ms on Linux). Little CPU,
	// latency up to the nap; a wake-up every ~1 ms while waiting.
	PollNap PollMode = "nap"
	// PollSpin: poll without sleeping while work is outstanding, sleep
	// until the next Post when none is. Lowest latency; takes a CPU while
	// transfers run (on a software device, the CPU that moves the bytes).
	PollSpin PollMode = "spin"
	// PollEvent: after 64 empty polls, arm the CQ and block on its
	// completion channel. No CPU while waiting; a completion that comes
	// after the polls costs an interrupt and a thread wake-up. The default:
	// in the TCG VM it gave the highest bandwidth of the three (3-10% above
	// nap) at about nap's one-batch latency (see doc.go).
	PollEvent PollMode = "event"
)

// Config configures one verbs transport instance.
type Config struct {
	// Device is the RDMA device name (e.g. "rxe0", "mlx5_0"); GID, if set,
	// selects the device and GID index holding that GID instead. With
	// neither, the first device with an IPv4-mapped GID on port 1 is used.
	Device string
	GID    string
	// Listen is the TCP address of the handshake listener (qp exchange);
	// default 127.0.0.1:0.
	Listen string
	// Timeout is the QP's local ACK timeout exponent (4.096 µs × 2^Timeout),
	// 1..31; default 14 (67 ms). 0 (infinite) is refused.
	Timeout uint8
	// RetryCnt is the QP's transport retry count, 1..6 (0 means the default,
	// 6). 7 means
	// "retry forever" on rxe and is refused.
	RetryCnt uint8
	// QueueDepth is the send queue depth of each QP (work requests in
	// flight per peer); default 512.
	QueueDepth int
	// MaxBatch is the most operations in one batch; default 256.
	MaxBatch int
	// Revoke selects the fencing mechanism; default auto.
	Revoke RevokeMode
	// TailMargin is added to the computed retry tail in MaxTail; default 1 s.
	TailMargin time.Duration
	// Poll selects how completions are waited for; default event.
	Poll PollMode
}

const (
	defaultTimeout    = 14
	defaultRetryCnt   = 6
	defaultDepth      = 512
	defaultMaxBatch   = 256
	defaultTailMargin = time.Second
	maxOpBytes        = 1 << 30
)

func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
	if c.RetryCnt == 0 {
		c.RetryCnt = defaultRetryCnt
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = defaultDepth
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = defaultMaxBatch
	}
	if c.Revoke == "" {
		c.Revoke = RevokeAuto
	}
	if c.TailMargin == 0 {
		c.TailMargin = defaultTailMargin
	}
	if c.Poll == "" {
		c.Poll = PollEvent
	}
	return c
}

// validate checks a defaulted config; every error it returns is
// errdefs.InvalidArgument.
func (c Config) validate() error {
	switch {
	case c.Timeout < 1 || c.Timeout > 31:
		return invalidConfig("QP timeout exponent %d outside 1..31", c.Timeout)
	case c.RetryCnt >= 7:
		return invalidConfig("retry_cnt %d refused: 7 retries forever on rxe (and under RNR elsewhere), so no tail bound exists", c.RetryCnt)
	case c.QueueDepth < 1 || c.QueueDepth > 16384:
		return invalidConfig("queue depth %d outside 1..16384", c.QueueDepth)
	case c.MaxBatch < 1 || c.MaxBatch > c.QueueDepth:
		return invalidConfig("max batch %d outside 1..queue depth %d", c.MaxBatch, c.QueueDepth)
	case c.TailMargin < 0:
		return invalidConfig("negative tail margin")
	}
	switch c.Revoke {
	case RevokeAuto, RevokeMW1, RevokeMR:
	default:
		return invalidConfig("revoke mode %q (want auto, mw1 or mr)", c.Revoke)
	}
	switch c.Poll {
	case PollNap, PollSpin, PollEvent:
	default:
		return invalidConfig("poll mode %q (want nap, spin or event)", c.Poll)
	}
	if c.GID != "" {
		if _, err := parseGID(c.GID); err != nil {
			return err
		}
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return invalidConfig("listen address %q: %v", c.Listen, err)
	}
	return nil
}

// invalidConfig classifies a configuration error: the settings are wrong,
// not the device or the network, so retrying with them cannot help.
func invalidConfig(format string, args ...any) error {
	return errdefs.Errorf(errdefs.InvalidArgument, "verbs: "+format, args...)
}

// RetryTail is how long a requester QP keeps retransmitting a work request
// before it completes with a retry-exceeded error: 4.096 µs × 2^timeout per
// attempt, retry_cnt + 1 attempts.
func RetryTail(timeout, retryCnt uint8) time.Duration {
	per := time.Duration(4096*(uint64(1)<<timeout)) * time.Nanosecond
	return per * time.Duration(uint64(retryCnt)+1)
}

// MaxTail is the honest bound the plugin declares: the retry tail of its QPs
// plus a margin (timer granularity, scheduling, the device's own slack).
// Without Quiesce, a write posted before a failure may still be
// retransmitted for at most the retry tail.
func (c Config) MaxTail() time.Duration {
	return RetryTail(c.Timeout, c.RetryCnt) + c.TailMargin
}

// parseGID parses a GID in IPv6 notation (an IPv4 address is taken as its
// IPv4-mapped GID, as RoCEv2 writes it).
func parseGID(s string) ([16]byte, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return [16]byte{}, invalidConfig("GID %q: %v", s, err)
	}
	return a.As16(), nil
}

// ConfigFromEnv reads KVFENCE_VERBS_DEVICE (else KVFENCE_DEVICE), _GID, _LISTEN, _TIMEOUT,
// _RETRY_CNT, _QUEUE_DEPTH, _MAX_BATCH, _REVOKE, _TAIL_MARGIN, _POLL.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Device: getenv("KVFENCE_VERBS_DEVICE"),
		GID:    getenv("KVFENCE_VERBS_GID"),
		Listen: getenv("KVFENCE_VERBS_LISTEN"),
		Revoke: RevokeMode(getenv("KVFENCE_VERBS_REVOKE")),
		Poll:   PollMode(getenv("KVFENCE_VERBS_POLL")),
	}
	if c.Device == "" {
		c.Device = getenv("KVFENCE_DEVICE") // what the conformance suite passes
	}
	u8 := func(name string, dst *uint8) error {
		if v := getenv(name); v != "" {
			n, err := strconv.ParseUint(v, 10, 8)
			if err != nil {
				return invalidConfig("%s=%q: %v", name, v, err)
			}
			*dst = uint8(n)
		}
		return nil
	}
	in := func(name string, dst *int) error {
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return invalidConfig("%s=%q: %v", name, v, err)
			}
			*dst = n
		}
		return nil
	}
	if err := u8("KVFENCE_VERBS_TIMEOUT", &c.Timeout); err != nil {
		return c, err
	}
	if err := u8("KVFENCE_VERBS_RETRY_CNT", &c.RetryCnt); err != nil {
		return c, err
	}
	if err := in("KVFENCE_VERBS_QUEUE_DEPTH", &c.QueueDepth); err != nil {
		return c, err
	}
	if err := in("KVFENCE_VERBS_MAX_BATCH", &c.MaxBatch); err != nil {
		return c, err
	}
	if v := getenv("KVFENCE_VERBS_TAIL_MARGIN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return c, invalidConfig("KVFENCE_VERBS_TAIL_MARGIN=%q: %v", v, err)
		}
		c.TailMargin = d
	}
	c = c.withDefaults()
	return c, c.validate()
}
