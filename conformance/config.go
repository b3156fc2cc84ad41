package conformance

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
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
	// TwoHost runs the target plugin processes on a second host: here a
	// network namespace with its own `kvfence conformance target` process
	// (TargetCommand), which owns the destination memory and answers over
	// the authenticated control channel (docs/conformance-two-host.md). The
	// initiators run in a namespace of their own; implies NetNS's link.
	TwoHost bool
	// RemoteTarget, instead, is the control address of a `kvfence
	// conformance target` already running on another machine, which holds
	// RemoteSecret (at least 16 bytes). The suite runs every group against
	// it; the link-fault checks, which need TwoHost's namespaces, are NOT
	// RUN, so such a run is partial.
	RemoteTarget string
	RemoteSecret []byte
	// TargetCommand runs `kvfence conformance target` for TwoHost (the
	// kvfence binary and "conformance", "target"); the run appends flags.
	TargetCommand []string
	// NetemDevices, when set, are the devices the data path crosses in this
	// namespace (the Soft-RoCE VM's veth pair under rxe0/rxe1): the netem
	// checks shape them (root). The proxy is then off.
	NetemDevices []string
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
	// Default GuardTails × the plugin's MaxTail, never below GuardFloor. A
	// shorter explicit value is allowed (tests) and makes the certificate
	// say so.
	GuardWindow time.Duration
	// GuardFloor is the shortest guard window whatever the plugin claims:
	// the suite does not let a plugin that declares a tiny MaxTail choose
	// how briefly it is watched. Default DefaultGuardFloor; the certificate
	// records it.
	GuardFloor time.Duration
	// GuardTails is the default multiple of MaxTail. Default 2.
	GuardTails int
	// MaxWatch caps every wait the suite derives from the plugin's MaxTail
	// (guard windows, the crash settle watch, the tail checks' offsets). A
	// backend with no bounded tail (Mooncake over TCP, NIXL) declares a
	// MaxTail of years; it is watched MaxWatch long, and the report says that
	// its tail was declared unbounded, not measured. Default
	// DefaultMaxWatch.
	MaxWatch time.Duration
	// CompletionTimeout bounds the wait for any one completion. Default 30s.
	CompletionTimeout time.Duration
	// Repeat is how often the idempotency check repeats its cycle. Default 20.
	Repeat int
	// PerfBytes is how much the bandwidth probe moves. Default 64 MiB.
	PerfBytes uint64
	// SoakBatches and SoakFor: the soak posts at least SoakBatches batches
	// and keeps going until SoakFor has passed, on one plugin pair. Zero
	// SoakBatches means DefaultSoakBatches (small: the library default is
	// for tests; the CLI's defaults are 5000 and 2 minutes). Both are
	// recorded in the report and the certificate.
	SoakBatches int
	SoakFor     time.Duration
	// FailFast stops the run at the first failed check (the rest of the
	// groups are recorded as not run); a certification needs one broken
	// promise to fail.
	FailFast bool
	// Groups, when non-empty, limits the run to these groups. Such a run is
	// partial: it never yields a certificate.
	Groups []string
	// Progress receives one line per check as it finishes, with its
	// elapsed time (nil: discarded).
	Progress io.Writer
	// Log receives detail: each check's notes and the plugins' stderr (nil:
	// discarded).
	Log io.Writer
}

// DefaultGuardFloor is the default GuardFloor: several seconds, far above
// any scheduling hiccup on a loaded machine and independent of the claim.
const DefaultGuardFloor = 3 * time.Second

// DefaultSoakBatches is the default SoakBatches.
const DefaultSoakBatches = 300

// DefaultMaxWatch is the default MaxWatch.
const DefaultMaxWatch = 30 * time.Second

const (
	defaultMaxWrite = 8 << 20
	minMaxWrite     = 64 << 10
	maxMaxWrite     = 64 << 20
)

func (c Config) withDefaults() Config {
	if c.MaxWriteSize == 0 {
		c.MaxWriteSize = defaultMaxWrite
	}
	if c.MaxWriteSize > maxMaxWrite {
		c.MaxWriteSize = maxMaxWrite
	}
	if c.MaxWriteSize < minMaxWrite {
		c.MaxWriteSize = minMaxWrite
	}
	if c.GuardTails <= 0 {
		c.GuardTails = 2
	}
	if c.GuardFloor <= 0 {
		c.GuardFloor = DefaultGuardFloor
	}
	if c.CompletionTimeout <= 0 {
		c.CompletionTimeout = 30 * time.Second
	}
	if c.MaxWatch <= 0 {
		c.MaxWatch = DefaultMaxWatch
	}
	if c.Repeat <= 0 {
		c.Repeat = 20
	}
	if c.PerfBytes == 0 {
		c.PerfBytes = 64 << 20
	}
	if c.SoakBatches <= 0 {
		c.SoakBatches = DefaultSoakBatches
	}
	if c.Proxy == "" {
		c.Proxy = "auto"
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// Validate refuses a configuration the suite cannot honour, before any
// process starts: a missing plugin, unknown groups or proxy modes, an
// environment entry without '=', negative durations or counts, sizes out
// of range. Zero values mean "the default".
func (c Config) Validate() error {
	if c.Plugin == "" {
		return fmt.Errorf("no plugin given")
	}
	st, err := os.Stat(c.Plugin)
	switch {
	case err != nil:
		return fmt.Errorf("plugin: %w", err)
	case !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("plugin %s is not an executable file", c.Plugin)
	}
	for _, check := range []func() error{c.validateLink, c.validateNames, c.validateNumbers} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateLink: the proxy mode, and the link options that exclude it.
func (c Config) validateLink() error {
	switch c.Proxy {
	case "", "auto", "on", "off":
	default:
		return fmt.Errorf("proxy %q: want auto, on or off", c.Proxy)
	}
	if c.Proxy == "on" && (c.NetNS || c.TwoHost || len(c.NetemDevices) > 0) {
		return fmt.Errorf("proxy on with netns, two hosts or netem devices: the faults are injected on those links")
	}
	if c.TwoHost && len(c.TargetCommand) == 0 {
		return fmt.Errorf("two hosts: no command to run the target host (kvfence conformance target)")
	}
	if c.TwoHost && (len(c.NetemDevices) > 0 || c.TargetAddr != "") {
		return fmt.Errorf("two hosts: the run builds its own link; netem devices and a target address do not apply")
	}
	return c.validateRemote()
}

// validateRemote: a remote target needs its secret, and excludes the links
// the suite builds itself.
func (c Config) validateRemote() error {
	if c.RemoteTarget == "" {
		return nil
	}
	if c.TwoHost || c.NetNS || c.Proxy == "on" {
		return fmt.Errorf("remote target %s: not with two hosts of our own, netns or the proxy", c.RemoteTarget)
	}
	if len(c.RemoteSecret) < 16 {
		return fmt.Errorf("remote target %s: the control channel's secret must be at least 16 bytes", c.RemoteTarget)
	}
	return nil
}

// validateNames: groups that exist, environment entries that are KEY=VALUE.
func (c Config) validateNames() error {
	names := GroupNames()
	for _, g := range c.Groups {
		if !slices.Contains(names, g) {
			return fmt.Errorf("unknown group %q (groups: %s)", g, strings.Join(names, ", "))
		}
	}
	for _, list := range [][]string{c.Env, c.InitiatorEnv, c.TargetEnv} {
		for _, kv := range list {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				return fmt.Errorf("environment entry %q: want KEY=VALUE", kv)
			}
		}
	}
	return nil
}

// validateNumbers: no negative durations or counts, sizes in range.
func (c Config) validateNumbers() error {
	for name, d := range map[string]time.Duration{"guard window": c.GuardWindow, "guard floor": c.GuardFloor, "completion timeout": c.CompletionTimeout, "max watch": c.MaxWatch} {
		if d < 0 {
			return fmt.Errorf("%s %v is negative", name, d)
		}
	}
	if c.SoakBatches < 0 || c.SoakFor < 0 {
		return fmt.Errorf("soak batches %d and soak duration %v must not be negative", c.SoakBatches, c.SoakFor)
	}
	if c.GuardTails < 0 || c.Repeat < 0 {
		return fmt.Errorf("guard tails %d and repeat %d must not be negative", c.GuardTails, c.Repeat)
	}
	if c.MaxWriteSize != 0 && (c.MaxWriteSize < minMaxWrite || c.MaxWriteSize > maxMaxWrite) {
		return fmt.Errorf("largest write %d: want %d..%d bytes", c.MaxWriteSize, minMaxWrite, maxMaxWrite)
	}
	return nil
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
