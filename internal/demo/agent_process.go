package demo

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/delayproxy"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/internal/routerlink"
	"github.com/kvfence/kvfence/sdk"
)

// AgentConfig is one rank process of the demo (kvfence __agent), its
// flags already checked and its plugin, log and TLS opened by the command.
type AgentConfig struct {
	Role                                  string // decode or prefill
	Rank, DecodeRank                      int
	Control, DecodeAddr, Metrics          string
	Slots, Shards, Lanes, SourcePages     int
	MaxInflight                           int
	ShardBytes                            int64
	Fence, Checksums                      bool
	Revoke                                agent.RevokeOrder
	QuiesceGrace, Lease, MaxHold, MaxTail time.Duration
	Delays                                []time.Duration // decode: a delaying proxy per value on the data path
	AdvertiseHosts                        []string        // decode: the data endpoint once per host
	TLS                                   *tls.Config
	Log                                   hclog.Logger
	Plugin                                *sdk.Plugin          // nil under the restart fence
	Restart                               *agent.RestartConfig // decode: the restart fence, or nil
}

// rankProcess is a started rank: its control address, metrics, and stop.
type rankProcess struct {
	control string
	metrics *agent.Metrics
	stop    func()
}

// RunAgent runs one rank until SIGTERM or SIGINT: it starts the agent with
// the demo's simulated engine behind it, serves /metrics, and prints
// "READY <control address> <metrics address>" on ready once it can serve.
func RunAgent(c AgentConfig, ready io.Writer) error {
	ctx := context.Background()
	start := startPrefillRank
	if c.Role == "decode" {
		start = startDecodeRank
	}
	rp, err := start(ctx, c)
	if err != nil {
		return err
	}
	maddr, closeMetrics, err := agent.ServeMetrics(c.Metrics, rp.metrics.Registry)
	if err != nil {
		rp.stop()
		return err
	}
	defer closeMetrics()
	fmt.Fprintf(ready, "READY %s %s\n", rp.control, maddr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	rp.stop()
	return nil
}

// startDecodeRank starts the decode agent, which checks every page with
// the content oracle, and the simulated decode engine that takes the
// router's orders.
func startDecodeRank(ctx context.Context, c AgentConfig) (*rankProcess, error) {
	cfg := agent.DecodeConfig{Restart: c.Restart, Rank: core.RankID(c.Rank), Slots: c.Slots, ShardBytes: c.ShardBytes, Shards: c.Shards,
		Lease: c.Lease, MaxHold: c.MaxHold, MaxDeclaredTail: c.MaxTail, ClockMargin: 100 * time.Millisecond,
		Fence: c.Fence, Revoke: c.Revoke, Check: oracle.Check{}, Checksums: c.Checksums,
		ControlAddr: c.Control, TLS: c.TLS, Logger: c.Log}
	eng := NewDecodeEngine()
	if err := routerlink.ServeCommands(&cfg, eng.Serve); err != nil {
		return nil, err
	}
	if len(c.AdvertiseHosts) > 0 {
		cfg.AdvertiseData = func(ep sdk.Endpoint) []sdk.Endpoint { return perHost(ep, c.AdvertiseHosts, c.Log) }
	}
	px := &proxies{delays: c.Delays, log: c.Log}
	if len(c.Delays) > 0 {
		cfg.AdvertiseData = px.advertise
	}
	var tr sdk.Transport
	if c.Plugin != nil {
		tr = c.Plugin.Transport()
	}
	d, err := agent.NewDecode(ctx, cfg, tr)
	if err != nil {
		return nil, err
	}
	eng.Start(d)
	return &rankProcess{control: d.Addr(), metrics: d.Metrics, stop: func() {
		d.Close()
		px.close()
	}}, nil
}

// startPrefillRank starts a prefill agent with the simulated prefill
// engine behind it and waits (up to 30 s) for its link to decode.
func startPrefillRank(ctx context.Context, c AgentConfig) (*rankProcess, error) {
	eng := NewPrefillEngine(uint32(c.Rank))
	cfg := agent.PrefillConfig{Rank: core.RankID(c.Rank), DecodeAddr: c.DecodeAddr, DecodeRank: core.RankID(c.DecodeRank),
		SourcePages: c.SourcePages, ShardBytes: c.ShardBytes, Lanes: c.Lanes,
		MaxInflight: c.MaxInflight, MaxBatchPages: 4, QuiesceGrace: c.QuiesceGrace, Heartbeat: 200 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
		RequestTombstone: 15 * time.Second, BootstrapTimeout: 10 * time.Second, Checksums: c.Checksums,
		ControlAddr: c.Control, TLS: c.TLS, Logger: c.Log, Events: c.Plugin.Events()}
	if err := routerlink.ServeCommands(&cfg, eng.Serve); err != nil {
		return nil, err
	}
	p, err := agent.NewPrefill(ctx, cfg, c.Plugin.Transport())
	if err != nil {
		return nil, err
	}
	eng.Start(p)
	for deadline := time.Now().Add(30 * time.Second); !p.Linked(); {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("prefill rank %d: no link to decode at %s", c.Rank, c.DecodeAddr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &rankProcess{control: p.Addr(), metrics: p.Metrics, stop: func() {
		eng.Stop()
		p.Close()
	}}, nil
}

// proxies are the delaying proxies on a decode rank's data path: one per
// delay, and lane i of every prefill rank goes through proxy i % n, so
// requests on a slow lane are overtaken by requests on a fast one, as on a
// multi-NIC fabric.
type proxies struct {
	delays []time.Duration
	log    hclog.Logger
	px     []*delayproxy.Proxy
}

// advertise starts the proxies in front of ep and advertises them instead.
func (p *proxies) advertise(ep sdk.Endpoint) []sdk.Endpoint {
	var eps []sdk.Endpoint
	// The proxies forward bytes to host:port; an identity the address pins
	// after '#' (tcp: the plugin's certificate fingerprint) stays in the
	// advertised address.
	target, pin, pinned := strings.Cut(ep.Address, "#")
	for _, d := range p.delays {
		px := &delayproxy.Proxy{Target: target, Delays: []time.Duration{d}}
		addr, err := px.Start("127.0.0.1:0")
		if err != nil {
			p.log.Error("delaying proxy", "error", err)
			continue
		}
		p.px = append(p.px, px)
		p.log.Info("delaying proxy on the data path", "listen", addr, "target", ep.Address, "delay", d)
		e := ep
		e.Address = addr
		if pinned {
			e.Address += "#" + pin
		}
		eps = append(eps, e)
	}
	return eps
}

func (p *proxies) close() {
	for _, px := range p.px {
		px.Close()
	}
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
