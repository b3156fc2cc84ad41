package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/internal/demo"
)

// agentRule is one check of __agent's flags. Every rule runs before the
// agent opens its log file or starts its plugin, so a bad flag is one line
// and exit 2 at once, not a failure 30 s into a link attempt.
type agentRule struct {
	flag  string
	check func(f agentFlags) error // nil when the flag is fine
}

// Bounds of an agent's sizes, beyond which a run cannot be meant.
const (
	maxAgentShards     = agent.MaxTargets
	maxAgentShardBytes = 1 << 30
	maxAgentLanes      = 256
	maxAgentPages      = 1 << 24
	maxAgentInflight   = 1 << 20
	maxAgentLease      = 10 * time.Minute
)

func intIn(name string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("--%s must be between %d and %d, got %d", name, lo, hi, v)
	}
	return nil
}

func hostPort(name, v string) error {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return fmt.Errorf("--%s %q is not host:port: %v", name, v, err)
	}
	return nil
}

func durationIn(name string, v, lo, hi time.Duration) error {
	if v < lo || v > hi {
		return fmt.Errorf("--%s must be between %v and %v, got %v", name, lo, hi, v)
	}
	return nil
}

var agentRules = []agentRule{
	{"unsafe", func(f agentFlags) error { return knownunsafe.SelectForAgents(f.unsafe) }},
	{"role", func(f agentFlags) error {
		if f.role != "decode" && f.role != "prefill" {
			return fmt.Errorf("--role must be decode or prefill, not %q", f.role)
		}
		return nil
	}},
	{"rank", func(f agentFlags) error { return intIn("rank", f.rank, 0, math.MaxUint32) }},
	{"control", func(f agentFlags) error { return hostPort("control", f.control) }},
	{"metrics", func(f agentFlags) error { return hostPort("metrics", f.metrics) }},
	{"decode", func(f agentFlags) error {
		switch {
		case f.role == "prefill" && f.decodeAddr == "":
			return fmt.Errorf("--role prefill needs --decode (the decode rank's control address)")
		case f.decodeAddr != "" && f.role != "prefill":
			return fmt.Errorf("--decode applies to --role prefill only")
		case f.decodeAddr != "":
			return hostPort("decode", f.decodeAddr)
		}
		return nil
	}},
	{"decode-rank", func(f agentFlags) error { return intIn("decode-rank", f.decodeRank, 0, math.MaxUint32) }},
	{"slots", func(f agentFlags) error { return intIn("slots", f.slots, 1, maxSlots) }},
	{"shards", func(f agentFlags) error { return intIn("shards", f.shards, 1, maxAgentShards) }},
	{"shard-bytes", func(f agentFlags) error {
		if f.shardBytes < 1 || f.shardBytes > maxAgentShardBytes {
			return fmt.Errorf("--shard-bytes must be between 1 and %d, got %d", maxAgentShardBytes, f.shardBytes)
		}
		return nil
	}},
	{"lanes", func(f agentFlags) error { return intIn("lanes", f.lanes, 1, maxAgentLanes) }},
	{"source-pages", func(f agentFlags) error { return intIn("source-pages", f.sourcePages, 1, maxAgentPages) }},
	{"max-inflight", func(f agentFlags) error { return intIn("max-inflight", f.maxInflight, 1, maxAgentInflight) }},
	{"quiesce-grace", func(f agentFlags) error { return durationIn("quiesce-grace", f.quiesceGrace, 0, maxAgentLease) }},
	{"lease", func(f agentFlags) error { return durationIn("lease", f.lease, time.Millisecond, maxAgentLease) }},
	{"max-hold", func(f agentFlags) error {
		if f.maxHold < f.lease || f.maxHold > time.Hour {
			return fmt.Errorf("--max-hold must be between --lease (%v) and 1h, got %v", f.lease, f.maxHold)
		}
		return nil
	}},
	{"max-declared-tail", func(f agentFlags) error {
		switch {
		case f.maxDeclaredTail < 0:
			return fmt.Errorf("--max-declared-tail must not be negative, got %v", f.maxDeclaredTail)
		case f.maxDeclaredTail != 0 && f.role != "decode":
			return fmt.Errorf("--max-declared-tail bounds what prefill ranks declare to a decode rank; it applies to --role decode only")
		}
		return nil
	}},
	{"data-delay", func(f agentFlags) error {
		if err := delaysIn(f.delays); err != nil { // validate.go
			return err
		}
		if len(f.delays) > 0 && f.role != "decode" {
			return fmt.Errorf("--data-delay applies to --role decode only")
		}
		return nil
	}},
	{"restart-fence-instances", func(f agentFlags) error {
		return checkRestartFence(f.restartInstances, f.restartAfter, f.role, f.delays, f.advertiseHosts) // agent_restart.go
	}},
	{"plugin-env", func(f agentFlags) error { return keyValues("plugin-env", f.pluginEnv) }},
	{"plugin-sha256", func(f agentFlags) error {
		if b, err := hex.DecodeString(f.pins.SHA256); f.pins.SHA256 != "" && (err != nil || len(b) != 32) {
			return fmt.Errorf("--plugin-sha256 %q is not 64 hex digits", f.pins.SHA256)
		}
		return nil
	}},
	{"require-certificate", func(f agentFlags) error {
		if f.pins.RequireCertificate && (f.pins.Certificate == "" || len(f.pins.TrustedKeys) == 0) {
			return fmt.Errorf("--require-certificate needs --plugin-certificate and at least one --trusted-key")
		}
		return nil
	}},
	{"log", func(f agentFlags) error {
		if f.logFile == "" {
			return nil
		}
		if err := checkWritableFile(f.logFile); err != nil {
			return fmt.Errorf("--log %s: %v", f.logFile, err)
		}
		return nil
	}},
	{"revoke", func(f agentFlags) error {
		o, err := agent.ParseRevokeOrder(f.revoke)
		if err != nil {
			return fmt.Errorf("--revoke: %v", err)
		}
		if f.eager && o == agent.RevokeAfterDrain {
			return fmt.Errorf("--eager-revoke contradicts --revoke after-drain")
		}
		return nil
	}},
	{"pki", func(f agentFlags) error {
		if f.pki == "" {
			return nil
		}
		if _, err := demo.LoadTLS(f.pki, agent.IdentityName(agent.Role(f.role), uint32(f.rank))); err != nil {
			return fmt.Errorf("--pki %s: %v", f.pki, err)
		}
		return nil
	}},
}

func keyValues(name string, kvs []string) error {
	for _, kv := range kvs {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("--%s %q: want KEY=VALUE", name, kv)
		}
	}
	return nil
}

// checkAgentFlags runs every rule in order; the first refusal is a usage
// error. The file-system checks come last (log, pki), and the log file a
// check creates is not left behind.
func checkAgentFlags(f agentFlags) error {
	for _, r := range agentRules {
		if err := r.check(f); err != nil {
			if errors.As(err, new(usageError)) {
				return err
			}
			return usageError{err}
		}
	}
	return nil
}
