package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/internal/demo"
	"github.com/kvfence/kvfence/plugins/tcp"
	"github.com/kvfence/kvfence/sdk"
)

// The kvfence binary carries its embedded default transport: run as
// "kvfence __plugin-tcp" it is the TCP reference plugin, so an agent loads
// it with sdk.Open on its own executable — out of process, as any plugin.
func init() { register(newPluginTCPCommand); register(newAgentCommand) }

func newPluginTCPCommand() *cobra.Command {
	return &cobra.Command{
		Use: "__plugin-tcp", Hidden: true, Args: cobra.NoArgs,
		Short: "serve the embedded TCP transport plugin (started by an agent through sdk.Open)",
		RunE: func(*cobra.Command, []string) error {
			log := sdk.NewPluginLogger("kvfence-plugin-tcp")
			cfg, err := tcp.ConfigFromEnv(os.Getenv)
			if err != nil {
				return err
			}
			t, err := tcp.New(cfg, log)
			if err != nil {
				return err
			}
			sdk.Serve(t, sdk.ServeOptions{Logger: log})
			return nil
		},
	}
}

type agentFlags struct {
	role, control, decodeAddr, pki, unsafe, logFile, metrics string
	revoke                                                   string
	plugin                                                   string
	pins                                                     sdk.PluginPins
	pluginEnv, advertiseHosts                                []string
	rank, decodeRank, slots, shards, lanes, sourcePages      int
	maxInflight, restartInstances                            int
	shardBytes                                               int64
	fence, eager, checksums                                  bool
	quiesceGrace, lease, maxHold, maxDeclaredTail            time.Duration
	restartAfter                                             time.Duration
	delays                                                   []time.Duration
	cpuProfile                                               string
	cpuProfileFor                                            time.Duration
}

// newAgentCommand is one rank as its own process (the demo starts three).
// It prints "READY <control address> <metrics address>" once it can serve
// (internal/demo's RunAgent runs the rank).
func newAgentCommand() *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use: "__agent", Hidden: true, Args: cobra.NoArgs,
		Short: "run one decode or prefill rank agent (started by kvfence demo)",
		RunE: func(*cobra.Command, []string) error {
			return runAgent(f) // agent_run.go
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.role, "role", "decode", "decode or prefill")
	fl.IntVar(&f.rank, "rank", 0, "rank id")
	fl.StringVar(&f.control, "control", "127.0.0.1:0", "control-plane listen address")
	fl.StringVar(&f.decodeAddr, "decode", "", "decode control address (prefill)")
	fl.IntVar(&f.decodeRank, "decode-rank", demo.DecodeRank, "the decode rank at --decode: a peer there with another identity is not linked (prefill)")
	fl.StringVar(&f.pki, "pki", "", "directory with throwaway certificates (mutual TLS); empty = plaintext")
	fl.StringVar(&f.unsafe, "unsafe", "", "known-unsafe core variant (demo only; needs a build with -tags kvfenceunsafe)")
	fl.StringVar(&f.logFile, "log", "", "log file (default stderr)")
	fl.StringVar(&f.metrics, "metrics", "127.0.0.1:0", "Prometheus /metrics listen address")
	fl.IntVar(&f.slots, "slots", 4096, "decode KV slots")
	fl.IntVar(&f.shards, "shards", 2, "tensor-parallel prefill ranks per request (shards per slot)")
	fl.Int64Var(&f.shardBytes, "shard-bytes", 8192, "bytes one rank writes per page")
	fl.IntVar(&f.lanes, "lanes", 4, "transport connections per decode rank (prefill)")
	fl.IntVar(&f.sourcePages, "source-pages", 8192, "source pages in shared memory (prefill)")
	// The core's in-flight bound is per rank, across all lanes. If slow-lane
	// batches fill it, fast-lane writes of later requests queue behind
	// them and land only after the slow ones: the lanes collapse into one
	// FIFO, unlike a real multi-QP/NIC fabric. 2048 unsettled batches is
	// more than the demo's 256 requests × 16 pages / 4 pages per batch.
	fl.IntVar(&f.maxInflight, "max-inflight", 2048, "unsettled batches per prefill rank, all lanes together (prefill)")
	fl.DurationVar(&f.quiesceGrace, "quiesce-grace", 2*time.Second, "wait this long for in-flight batches to complete before cutting a data lane to quiesce them (prefill)")
	fl.DurationVar(&f.lease, "lease", 2*time.Second, "lease decode grants per Assign and per heartbeat (decode)")
	fl.DurationVar(&f.maxHold, "max-hold", 10*time.Second, "no lease past admission + this (decode)")
	fl.DurationVar(&f.maxDeclaredTail, "max-declared-tail", 0, "longest data-plane tail a prefill rank may declare; a rank declaring more is refused at link (decode; 0: the core's default, 5m, or this rank's own tail if longer)")
	fl.BoolVar(&f.fence, "fence", true, "per-exposure keys with revocation (decode)")
	fl.StringVar(&f.revoke, "revoke", "auto", "when an aborted request's keys are revoked: auto (at the abort where the transport isolates refused writes, else after the drain), at-abort, after-drain (decode)")
	fl.BoolVar(&f.eager, "eager-revoke", false, "the same as --revoke at-abort")
	_ = fl.MarkDeprecated("eager-revoke", "use --revoke at-abort")
	fl.BoolVar(&f.checksums, "checksums", false, "checksums at commit: computed by prefill, required and checked by decode")
	fl.DurationSliceVar(&f.delays, "data-delay", nil, "put a delaying proxy on the data path; connection k is delayed by the k-th value, cyclically (decode)")
	// An external transport plugin instead of the embedded TCP one (e.g.
	// kvfence-plugin-verbs in the Soft-RoCE VM), configured through its
	// environment.
	fl.StringVar(&f.plugin, "plugin", "", pluginFlagHelp)
	fl.StringArrayVar(&f.pluginEnv, "plugin-env", nil, "K=V added to the plugin's environment (repeatable)")
	fl.StringVar(&f.pins.SHA256, "plugin-sha256", "", "pin the plugin binary's sha256 (hex); the hashed copy is what runs")
	fl.BoolVar(&f.pins.RequireCertificate, "require-certificate", false, "refuse a plugin without a valid conformance certificate for its exact sha256")
	fl.StringVar(&f.pins.Certificate, "plugin-certificate", "", "the plugin's signed conformance certificate (with --require-certificate)")
	fl.StringSliceVar(&f.pins.TrustedKeys, "trusted-key", nil, "ed25519 public key (PEM) trusted to sign certificates (repeatable)")
	fl.IntVar(&f.restartInstances, "restart-fence-instances", 0, "restart fence: run this many target plugin processes and end (reap) one before reusing the memory of a hold it served that cannot otherwise end in time, for transports that cannot revoke (decode; 0: off)")
	fl.DurationVar(&f.restartAfter, "restart-fence-after", defaultRestartAfter, "restart fence: a hold lasting this long restarts its target instance (decode, with --restart-fence-instances)")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile (pprof) of this rank to this path plus .ROLE-RANK, for --cpuprofile-for from start (where the fence's cost goes: kvfence demo --agent-arg=--cpuprofile=/tmp/p)")
	fl.DurationVar(&f.cpuProfileFor, "cpuprofile-for", 20*time.Second, "how long --cpuprofile samples (the demo kills its ranks, so the profile ends on a timer)")
	fl.StringSliceVar(&f.advertiseHosts, "advertise-hosts", nil, "advertise the data endpoint once per host, same port (the plugin must listen on a wildcard address): one connection per lane for plugins that key peers by address (decode)")
	return cmd
}
