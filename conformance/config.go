package conformance

import (
	"io"
	"time"
)

// SuiteVersion is written into every report and certificate.
const SuiteVersion = "0.1.0"

// Config says what to certify and how.
type Config struct {
	// Plugin is the plugin binary to certify (loaded twice: initiator and target).
	Plugin string
	// Env is added to both processes' environment (plugin settings such as
	// KVFENCE_TCP_WRITE_TTL); InitiatorEnv and TargetEnv to one each.
	Env, InitiatorEnv, TargetEnv []string
	// NetNS runs each process in its own network namespace joined by a veth
	// pair and injects tc netem faults (root only). TCP-specific: the
	// processes get KVFENCE_TCP_LISTEN set to their namespace's address.
	NetNS bool
	// TargetAddr, when set, replaces the address part of the target's
	// endpoint that the initiator dials (a NAT or another interface). The
	// target process still runs here: the suite must watch its memory.
	TargetAddr string
	// Device is the device the plugin should use (RDMA plugins); it is
	// passed as KVFENCE_DEVICE and recorded in the certificate.
	Device string
	// Proxy controls the in-path TCP fault proxy: "auto" (default: used when
	// the target's endpoint address is host:port and NetNS is off), "on", "off".
	Proxy string
	// MaxWriteSize is the largest single write checked. Default 8 MiB,
	// at most 64 MiB.
	MaxWriteSize uint64
	// GuardWindow is how long the sentinel watcher must see target memory
	// unchanged after a Succeeded, a FailedDefinite or a Quiesce return.
	// Default GuardTails × the plugin's MaxTail. A shorter explicit value is
	// allowed (tests) and makes the certificate say so.
	GuardWindow time.Duration
	// GuardTails is the default multiple of MaxTail. Default 2.
	GuardTails int
	// CompletionTimeout bounds the wait for any one completion. Default 30s.
	CompletionTimeout time.Duration
	// Repeat is how often the idempotency check repeats its cycle. Default 20.
	Repeat int
	// PerfBytes is how much the bandwidth probe moves. Default 64 MiB.
	PerfBytes uint64
	// FailFast stops the run at the first failed check (the rest of the
	// groups are recorded as not run); a certification needs one broken
	// promise to fail.
	FailFast bool
	// Groups, when non-empty, limits the run to these groups.
	Groups []string
	// Log receives progress lines and the plugins' stderr (nil: discarded).
	Log io.Writer
}

const (
	defaultMaxWrite = 8 << 20
	maxMaxWrite     = 64 << 20
)

func (c Config) withDefaults() Config {
	if c.MaxWriteSize == 0 {
		c.MaxWriteSize = defaultMaxWrite
	}
	if c.MaxWriteSize > maxMaxWrite {
		c.MaxWriteSize = maxMaxWrite
	}
	if c.MaxWriteSize < 64<<10 {
		c.MaxWriteSize = 64 << 10
	}
	if c.GuardTails <= 0 {
		c.GuardTails = 2
	}
	if c.CompletionTimeout <= 0 {
		c.CompletionTimeout = 30 * time.Second
	}
	if c.Repeat <= 0 {
		c.Repeat = 20
	}
	if c.PerfBytes == 0 {
		c.PerfBytes = 64 << 20
	}
	if c.Proxy == "" {
		c.Proxy = "auto"
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

func (c Config) wants(group string) bool {
	if len(c.Groups) == 0 {
		return true
	}
	for _, g := range c.Groups {
		if g == group {
			return true
		}
	}
	return false
}
