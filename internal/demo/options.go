package demo

import (
	"io"
	"strings"
	"time"
)

// DefaultSlots is the decode pool a run starts when Options.Slots is 0
// (the agent's default, __agent --slots).
const DefaultSlots = 4096

// Options size one run of the demo (and of each bench repetition). The
// command line checks them before a run starts (cmd/kvfence validate.go);
// Run trusts them.
type Options struct {
	// Exe is the kvfence binary the rank processes run (default: this
	// executable).
	Exe                                       string
	Requests, Concurrency, MinPages, MaxPages int
	AbortShare                                float64
	PageEvery, DecodeFor                      time.Duration
	Delays                                    []time.Duration
	Unsafe                                    string
	Fence                                     bool
	TLS                                       bool
	Progress                                  io.Writer // nil: no progress bar
	Dir                                       string    // run directory (logs, certs); created if empty
	Seed                                      uint64
	// Slots sizes decode's KV pool (0: DefaultSlots); the bench's scarce
	// mode makes it small so holds cost admissions.
	Slots int
	// KillPrefillAfter, when positive, kill -9s prefill rank 2 that long
	// into the run (the crash test).
	KillPrefillAfter time.Duration
	// RestartDelay, in the decode-restart run, waits this long after the
	// kill before starting the new instance (a slow restart, as on a loaded
	// machine: the test's).
	RestartDelay time.Duration
	// Checksums: every rank computes (prefill) or checks (decode) a
	// checksum at commit.
	Checksums bool
	// Plugin, when set, is the transport plugin binary every rank loads
	// instead of the embedded TCP one (the Soft-RoCE VM: the verbs plugin),
	// with PrefillEnv/DecodeEnv added to its environment; no delaying proxy
	// is started (the network delays: netem), Delays only widen the window
	// in which aborts fall. DataHosts: decode advertises its data endpoint
	// once per host (one connection per lane, see __agent --advertise-hosts).
	Plugin                string
	PrefillEnv, DecodeEnv []string
	DataHosts             []string
	// RestartInstances, when positive, runs decode with the restart fence
	// (--restart-fence-instances): that many target plugin processes,
	// one restarted when a hold on it must end sooner than its bound (a
	// hold past RestartAfter, a dead writer on a transport that cannot
	// revoke). Decode then takes no delaying proxy.
	RestartInstances int
	RestartAfter     time.Duration
	// AgentArgs are extra __agent flags for every rank (e.g. a longer
	// --lease on a slow emulated machine).
	AgentArgs []string
}

// PoolSlots is the size of the decode pool the run starts.
func (o Options) PoolSlots() int {
	if o.Slots > 0 {
		return o.Slots
	}
	return DefaultSlots
}

// PluginArgs are the __agent flags that load o.Plugin with env.
func (o Options) PluginArgs(env []string) []string {
	if o.Plugin == "" {
		return nil
	}
	a := []string{"--plugin", o.Plugin}
	for _, kv := range env {
		a = append(a, "--plugin-env", kv)
	}
	return a
}

// Variant is the core variant's name ("safe" for the safe core).
func (o Options) Variant() string {
	if o.Unsafe == "" {
		return "safe"
	}
	return o.Unsafe
}

// maxDelay is the longest of ds.
func maxDelay(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// delayList is ds as one --data-delay value.
func delayList(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}
