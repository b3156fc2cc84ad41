package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/internal/demo"
	"github.com/kvfence/kvfence/sdk"
)

// runAgent is kvfence __agent: it checks every flag, opens the log, the
// rank's TLS identity and its transport plugin, and hands the rank to
// internal/demo (RunAgent), which runs it until a signal.
func runAgent(f agentFlags) error {
	// The profile, when asked for, covers the checks too. Every flag is
	// checked before the log or the plugin opens (agent_rules.go);
	// a default build refuses every unsafe variant there (issue 15).
	if err := startCPUProfile(f); err != nil {
		return err
	}
	if err := checkAgentFlags(f); err != nil {
		return err
	}
	pluginPath, err := resolvePluginFlag(f.plugin)
	if err != nil {
		return err
	}
	out, closeLog, err := openAgentLog(f.logFile)
	if err != nil {
		return err
	}
	defer closeLog()
	c := agentConfig(f)
	c.Log = hclog.New(&hclog.LoggerOptions{Name: agentName(f), Output: out, Level: hclog.Info, JSONFormat: true})
	if c.TLS, err = agentTLS(f); err != nil {
		return err
	}
	closePlugin, err := agentTransport(f, pluginPath, &c)
	if err != nil {
		return err
	}
	defer closePlugin()
	return demo.RunAgent(c, os.Stdout)
}

func agentName(f agentFlags) string { return agent.IdentityName(agent.Role(f.role), uint32(f.rank)) }

// agentConfig copies the checked flags into the rank's configuration.
func agentConfig(f agentFlags) demo.AgentConfig {
	return demo.AgentConfig{Role: f.role, Rank: f.rank, DecodeRank: f.decodeRank,
		Control: f.control, DecodeAddr: f.decodeAddr, Metrics: f.metrics,
		Slots: f.slots, Shards: f.shards, Lanes: f.lanes, SourcePages: f.sourcePages, MaxInflight: f.maxInflight,
		ShardBytes: f.shardBytes, Fence: f.fence, Revoke: revokeOrder(f), Checksums: f.checksums,
		QuiesceGrace: f.quiesceGrace, Lease: f.lease, MaxHold: f.maxHold, MaxTail: f.maxDeclaredTail,
		Delays: f.delays, AdvertiseHosts: f.advertiseHosts}
}

// revokeOrder is --revoke (checked by agentRules), or at-abort for the
// deprecated --eager-revoke.
func revokeOrder(f agentFlags) agent.RevokeOrder {
	o, _ := agent.ParseRevokeOrder(f.revoke)
	if f.eager {
		o = agent.RevokeAtAbort
	}
	return o
}

// openAgentLog is the rank's log: the --log file, or stderr.
func openAgentLog(path string) (io.Writer, func(), error) {
	if path == "" {
		return os.Stderr, func() {}, nil
	}
	lf, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	return lf, func() { lf.Close() }, nil
}

// agentTLS is the rank's mutual-TLS identity from --pki (nil: plaintext).
func agentTLS(f agentFlags) (*tls.Config, error) {
	if f.pki == "" {
		return nil, nil
	}
	return demo.LoadTLS(f.pki, agentName(f))
}

// agentTransport opens the rank's plugin (checking a decode rank's
// --max-declared-tail against it) or, under the restart fence, the opener
// of decode's target instances; the returned func closes what it opened.
func agentTransport(f agentFlags, pluginPath string, c *demo.AgentConfig) (func(), error) {
	f.pins.SuiteVersions = []string{conformance.SuiteVersion}
	if f.restartInstances > 0 {
		open, err := targetOpener(pluginPath, f.pluginEnv, f.pins, c.Log) // agent_restart.go
		if err != nil {
			return nil, err
		}
		c.Restart = &agent.RestartConfig{Targets: f.restartInstances, After: f.restartAfter, Open: open}
		return func() {}, nil
	}
	plug, err := openPlugin(pluginPath, f.pluginEnv, f.pins, c.Log)
	if err != nil {
		return nil, err
	}
	if f.role == "decode" {
		if err := checkDeclaredTail(context.Background(), plug.Transport(), f.maxDeclaredTail); err != nil {
			plug.Close()
			return nil, err
		}
	}
	c.Plugin = plug
	return func() { _ = plug.Close() }, nil
}

// checkDeclaredTail refuses a --max-declared-tail shorter than this rank's
// own transport's tail: a prefill rank on the same transport would be
// refused (the core says so too, but only once the agent is half up).
func checkDeclaredTail(ctx context.Context, tr sdk.Transport, limit time.Duration) error {
	if limit == 0 {
		return nil
	}
	info, err := tr.Info(ctx)
	if err != nil {
		return err
	}
	if own := info.Capabilities.MaxTail; limit < own {
		return usagef("--max-declared-tail %v is shorter than this rank's own transport tail (%s declares %v): prefill ranks on the same transport would be refused", limit, info.Name, own)
	}
	return nil
}

// startCPUProfile samples this rank's CPU for f.cpuProfileFor into
// f.cpuProfile.ROLE-RANK; the demo ends its ranks with a signal, so the
// profile is closed on a timer rather than at exit.
func startCPUProfile(f agentFlags) error {
	if f.cpuProfile == "" {
		return nil
	}
	out, err := os.Create(fmt.Sprintf("%s.%s-%d", f.cpuProfile, f.role, f.rank))
	if err != nil {
		return usagef("--cpuprofile: %v", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	time.AfterFunc(f.cpuProfileFor, func() {
		pprof.StopCPUProfile()
		out.Close()
	})
	return nil
}
