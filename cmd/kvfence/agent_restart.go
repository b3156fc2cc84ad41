package main

import (
	"context"
	"encoding/hex"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/internal/demo"
	"github.com/kvfence/kvfence/sdk"
)

// The restart fence from the command line (issue 14 item 4): a decode rank
// started with --restart-fence-instances N runs N target plugin processes
// of its own and, when a hold on a transport that cannot revoke must end
// sooner than its bound, ends and reaps the instance that served it before
// the slot is reused (agent/restart.go).

// defaultRestartAfter is how long a hold may last before its instance is
// restarted, unless --restart-fence-after says otherwise.
const defaultRestartAfter = 2 * time.Second

// checkRestartFence refuses restart-fence flags that cannot work, before
// anything starts (exit 2). delays and hosts are the decode's data-path
// rewrites, which a restart fence does not take: each instance announces
// its own endpoint.
func checkRestartFence(instances int, after time.Duration, role string, delays []time.Duration, hosts []string) error {
	switch {
	case instances < 0 || instances > agent.MaxTargets:
		return usagef("--restart-fence-instances must be between 0 (off) and %d, got %d", agent.MaxTargets, instances)
	case after <= 0:
		return usagef("--restart-fence-after must be positive, got %v", after)
	case instances == 0:
		return nil
	case role != "decode":
		return usagef("--restart-fence-instances applies to --role decode only (decode runs the target instances)")
	case len(delays) > 0:
		return usagef("--restart-fence-instances does not take --data-delay: each target instance announces its own data endpoint, which no proxy sits on")
	case len(hosts) > 0:
		return usagef("--restart-fence-instances does not take --advertise-hosts: each target instance announces its own data endpoint")
	}
	return nil
}

// targetOpener starts one target plugin process per call: the plugin at
// path ("" = the embedded TCP one), pinned once to the sha256 it has now
// (unless pins already pin it), so every instance — the replacements too —
// runs exactly the file hashed here.
func targetOpener(path string, env []string, pins sdk.PluginPins, log hclog.Logger) (func(context.Context) (agent.TargetProcess, error), error) {
	if pins.SHA256 == "" && !pins.RequireCertificate {
		exe := path
		if exe == "" {
			self, err := os.Executable()
			if err != nil {
				return nil, err
			}
			exe = self
		}
		sum, err := sdk.FileSHA256(exe)
		if err != nil {
			return nil, err
		}
		pins.SHA256 = hex.EncodeToString(sum)
		log.Info("target plugin instances pinned to its sha256", "plugin", exe, "sha256", pins.SHA256)
	}
	return func(context.Context) (agent.TargetProcess, error) {
		p, err := openPlugin(path, env, pins, log)
		if err != nil {
			return nil, err
		}
		return p, nil
	}, nil
}

// restartFenceFlags are the restart-fence flags of demo and bench.
func restartFenceFlags(fl *pflag.FlagSet, o *demo.Options) {
	fl.IntVar(&o.RestartInstances, "restart-fence-instances", 0, "restart fence: decode runs this many target plugin processes and reaps one before reusing a hold it served that must end sooner than its bound (for transports that cannot revoke; 0: off). No delaying proxy on decode, no per-exposure keys")
	fl.DurationVar(&o.RestartAfter, "restart-fence-after", defaultRestartAfter, "restart fence: a hold lasting this long restarts its target instance")
}
