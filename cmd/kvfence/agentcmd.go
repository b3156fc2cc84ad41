package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/internal/demo"
	"github.com/kvfence/kvfence/internal/demo/delayproxy"
	"github.com/kvfence/kvfence/internal/demo/oracle"
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
}

// newAgentCommand is one rank as its own process (the demo starts three).
// It prints "READY <control address> <metrics address>" once it can serve.
func newAgentCommand() *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use: "__agent", Hidden: true, Args: cobra.NoArgs,
		Short: "run one decode or prefill rank agent (started by kvfence demo)",
		RunE:  func(*cobra.Command, []string) error { return runAgent(f) },
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
	fl.BoolVar(&f.eager, "eager-revoke", false, "revoke as soon as a request aborts (decode)")
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
	fl.StringSliceVar(&f.advertiseHosts, "advertise-hosts", nil, "advertise the data endpoint once per host, same port (the plugin must listen on a wildcard address): one connection per lane for plugins that key peers by address (decode)")
	return cmd
}

func runAgent(f agentFlags) error {
	// A default build refuses every unsafe variant here (issue 15: known-
	// unsafe cores are not selectable from an agent's flags).
	if err := knownunsafe.SelectForAgents(f.unsafe); err != nil {
		return usageError{err}
	}
	if f.role != "decode" && f.role != "prefill" {
		return usagef("--role must be decode or prefill, not %q", f.role)
	}
	switch {
	case f.maxDeclaredTail < 0:
		return usagef("--max-declared-tail must not be negative, got %v", f.maxDeclaredTail)
	case f.maxDeclaredTail != 0 && f.role != "decode":
		return usagef("--max-declared-tail bounds what prefill ranks declare to a decode rank; it applies to --role decode only")
	}
	if err := checkRestartFence(f.restartInstances, f.restartAfter, f.role, f.delays, f.advertiseHosts); err != nil { // agent_restart.go
		return err
	}
	pluginPath, err := resolvePluginFlag(f.plugin)
	if err != nil {
		return err
	}
	out := os.Stderr
	if f.logFile != "" {
		lf, err := os.Create(f.logFile)
		if err != nil {
			return err
		}
		defer lf.Close()
		out = lf
	}
	name := agent.IdentityName(agent.Role(f.role), uint32(f.rank))
	log := hclog.New(&hclog.LoggerOptions{Name: name, Output: out, Level: hclog.Info, JSONFormat: true})
	var tlsCfg *tls.Config
	if f.pki != "" {
		c, err := demo.LoadTLS(f.pki, name)
		if err != nil {
			return err
		}
		tlsCfg = c
	}
	f.pins.SuiteVersions = []string{conformance.SuiteVersion}
	var plug *sdk.Plugin
	if f.restartInstances == 0 {
		if plug, err = openPlugin(pluginPath, f.pluginEnv, f.pins, log); err != nil {
			return err
		}
		defer plug.Close()
	} // else decode opens its own target instances
	ctx := context.Background()
	var control string
	var metrics *agent.Metrics
	var stop func()
	switch f.role {
	case "decode":
		var tr sdk.Transport
		var restart *agent.RestartConfig
		if f.restartInstances > 0 {
			open, err := targetOpener(pluginPath, f.pluginEnv, f.pins, log)
			if err != nil {
				return err
			}
			restart = &agent.RestartConfig{Targets: f.restartInstances, After: f.restartAfter, Open: open}
		} else {
			if err := checkDeclaredTail(ctx, plug.Transport(), f.maxDeclaredTail); err != nil {
				return err
			}
			tr = plug.Transport()
		}
		cfg := agent.DecodeConfig{Restart: restart, Rank: core.RankID(f.rank), Slots: f.slots, ShardBytes: f.shardBytes, Shards: f.shards,
			Lease: f.lease, MaxHold: f.maxHold, MaxDeclaredTail: f.maxDeclaredTail, ClockMargin: 100 * time.Millisecond,
			Fence: f.fence, EagerRevoke: f.eager, Check: oracle.Check{}, Checksums: f.checksums,
			ControlAddr: f.control, TLS: tlsCfg, Logger: log}
		// The demo's simulated engine takes the router's orders.
		eng := demo.NewDecodeEngine()
		cfg.Commands = eng.Serve
		var proxies []*delayproxy.Proxy
		if len(f.advertiseHosts) > 0 {
			cfg.AdvertiseData = func(ep sdk.Endpoint) []sdk.Endpoint { return perHost(ep, f.advertiseHosts, log) }
		}
		if len(f.delays) > 0 {
			// One proxy per delay, and lane i of every prefill rank goes
			// through proxy i % n: requests on a slow lane are overtaken by
			// requests on a fast one, as on a multi-NIC fabric.
			cfg.AdvertiseData = func(ep sdk.Endpoint) []sdk.Endpoint {
				var eps []sdk.Endpoint
				// The proxies forward bytes to host:port; an identity the
				// address pins after '#' (tcp: the plugin's certificate
				// fingerprint) stays in the advertised address.
				target, pin, pinned := strings.Cut(ep.Address, "#")
				for _, d := range f.delays {
					px := &delayproxy.Proxy{Target: target, Delays: []time.Duration{d}}
					addr, err := px.Start("127.0.0.1:0")
					if err != nil {
						log.Error("delaying proxy", "error", err)
						continue
					}
					proxies = append(proxies, px)
					log.Info("delaying proxy on the data path", "listen", addr, "target", ep.Address, "delay", d)
					e := ep
					e.Address = addr
					if pinned {
						e.Address += "#" + pin
					}
					eps = append(eps, e)
				}
				return eps
			}
		}
		d, err := agent.NewDecode(ctx, cfg, tr)
		if err != nil {
			return err
		}
		eng.Start(d)
		control, metrics = d.Addr(), d.Metrics
		stop = func() {
			d.Close()
			for _, px := range proxies {
				px.Close()
			}
		}
	case "prefill":
		eng := demo.NewPrefillEngine(uint32(f.rank))
		p, err := agent.NewPrefill(ctx, agent.PrefillConfig{Commands: eng.Serve, Rank: core.RankID(f.rank), DecodeAddr: f.decodeAddr, DecodeRank: core.RankID(f.decodeRank),
			SourcePages: f.sourcePages, ShardBytes: f.shardBytes, Lanes: f.lanes,
			MaxInflight: f.maxInflight, MaxBatchPages: 4, QuiesceGrace: f.quiesceGrace, Heartbeat: 200 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
			RequestTombstone: 15 * time.Second, BootstrapTimeout: 10 * time.Second, Checksums: f.checksums,
			ControlAddr: f.control, TLS: tlsCfg, Logger: log, Events: plug.Events()}, plug.Transport())
		if err != nil {
			return err
		}
		eng.Start(p)
		for deadline := time.Now().Add(30 * time.Second); !p.Linked(); {
			if time.Now().After(deadline) {
				return fmt.Errorf("prefill rank %d: no link to decode at %s", f.rank, f.decodeAddr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		control, metrics = p.Addr(), p.Metrics
		stop = func() {
			eng.Stop()
			p.Close()
		}
	}
	maddr, closeMetrics, err := agent.ServeMetrics(f.metrics, metrics.Registry)
	if err != nil {
		return err
	}
	defer closeMetrics()
	fmt.Printf("READY %s %s\n", control, maddr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stop()
	return nil
}

// perHost advertises ep once per host, on ep's port.
func perHost(ep sdk.Endpoint, hosts []string, log hclog.Logger) []sdk.Endpoint {
	_, port, err := net.SplitHostPort(ep.Address)
	if err != nil {
		log.Error("advertise-hosts: data endpoint is not host:port; advertising it as is", "address", ep.Address)
		return nil
	}
	var eps []sdk.Endpoint
	for _, h := range hosts {
		e := ep
		e.Address = net.JoinHostPort(h, port)
		eps = append(eps, e)
	}
	log.Info("data endpoint advertised per host", "listen", ep.Address, "hosts", hosts)
	return eps
}

func pkiNames(prefills int) []string {
	names := []string{"router", "decode-0"}
	for i := 1; i <= prefills; i++ {
		names = append(names, fmt.Sprintf("prefill-%d", i))
	}
	return names
}

func joinPath(dir, name string) string { return filepath.Join(dir, strings.TrimSpace(name)) }

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
