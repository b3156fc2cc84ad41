package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/sdk"
)

// common is what both sides' JSON configs share: the transport plugin, the
// control plane's TLS and the log.
type common struct {
	Rank uint32 `json:"rank"`
	// Plugin is the transport plugin binary (default $KVFENCE_PLUGIN), run
	// as a child process of the engine's process.
	Plugin    string   `json:"plugin"`
	PluginEnv []string `json:"plugin_env"`
	// ControlAddr: decode listens here for prefill ranks ("127.0.0.1:0"
	// picks a port; kvfence_decode_addr says which).
	ControlAddr string `json:"control_addr"`
	// Mutual TLS for the control plane: this rank's certificate and key
	// (its common name is agent.IdentityName) and the deployment's CA. All
	// three or none (plaintext, for loopback tests only).
	TLSCert string `json:"tls_cert"`
	TLSKey  string `json:"tls_key"`
	TLSCA   string `json:"tls_ca"`
	// LogLevel (trace, debug, info, warn, error, off; default warn) and
	// LogFile (default stderr), JSON lines.
	LogLevel string `json:"log_level"`
	LogFile  string `json:"log_file"`
	// GPUMode: "staged" (default) or "direct" (gpu_mode.go).
	GPUMode string `json:"gpu_mode"`
}

type decodeJSON struct {
	common
	Slots         int   `json:"slots"`
	ShardBytes    int64 `json:"shard_bytes"`
	Shards        int   `json:"shards"`
	LeaseMs       int64 `json:"lease_ms"`
	MaxHoldMs     int64 `json:"max_hold_ms"`
	ClockMarginMs int64 `json:"clock_margin_ms"`
	// MaxDeclaredTailMs is the longest transport tail a prefill rank may
	// declare in its Hello (longer: refused at link time), and the most
	// this rank's own transport may declare (more: refused at open). Every
	// timeout hold lasts max_hold_ms + the writers' tail + clock_margin_ms
	// past admission, so this bounds the hold. 0: core's default (5 min).
	MaxDeclaredTailMs int64 `json:"max_declared_tail_ms"`
	Fence             *bool `json:"fence"`
	// EagerRevoke: true revokes an aborted request's keys at the abort,
	// false only after every writer drained; absent, at the abort where
	// the transport isolates refused writes (agent.RevokeAuto).
	EagerRevoke *bool `json:"eager_revoke"`
	Checksums   bool  `json:"checksums"`
	// DirectBuffer, DirectPages: gpu_mode "direct" (direct.go).
	DirectBuffer uint64 `json:"direct_buffer"`
	DirectPages  int    `json:"direct_pages"`
	// DirectBuffers, DirectPageBytes: the engine's KV buffers, one per
	// layer, in place of DirectBuffer (direct.go).
	DirectBuffers   []uint64 `json:"direct_buffers"`
	DirectPageBytes []int64  `json:"direct_page_bytes"`
	// DirectHostPages: host landing pages past direct_pages, for the rows
	// a request carries after its KV pages (SGLang's aux and state rows;
	// direct.go).
	DirectHostPages int `json:"direct_host_pages"`
}

type prefillJSON struct {
	common
	DecodeAddr         string `json:"decode_addr"`
	DecodeRank         uint32 `json:"decode_rank"` // the decode rank at decode_addr (decode TP >= 2)
	SourcePages        int    `json:"source_pages"`
	ShardBytes         int64  `json:"shard_bytes"`
	Lanes              int    `json:"lanes"`
	MaxInflight        int    `json:"max_inflight"`
	MaxBatchPages      int    `json:"max_batch_pages"`
	HeartbeatMs        int64  `json:"heartbeat_ms"`
	SkewMarginMs       int64  `json:"skew_margin_ms"`
	RequestTombstoneMs int64  `json:"request_tombstone_ms"`
	BootstrapTimeoutMs int64  `json:"bootstrap_timeout_ms"`
	QuiesceGraceMs     int64  `json:"quiesce_grace_ms"`
	Checksums          bool   `json:"checksums"`
}

// parseJSON reads a config strictly: an unknown field is a typo, and a
// typo in a safety setting must not pass silently.
func parseJSON(text string, v any) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("config: %v", err)
	}
	return nil
}

func revokeOrder(eager *bool) agent.RevokeOrder {
	switch {
	case eager == nil:
		return agent.RevokeAuto
	case *eager:
		return agent.RevokeAtAbort
	}
	return agent.RevokeAfterDrain
}

func ms(v, def int64) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Millisecond
}

func orInt(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// agentObj is what an agent handle holds: one side and its plugin process.
type agentObj struct {
	dec  *agent.Decode
	pre  *agent.Prefill
	plug *sdk.Plugin
	logf *os.File
	// pageBytes: decode's slot (one shard per prefill rank), prefill's shard.
	pageBytes int64
	shards    int // decode: prefill ranks per slot (checks.go bounds Init by it)
	// direct: decode's exported engine buffers in direct mode (direct.go)
	direct []*gpumem.DirectBuffer
}

func (a *agentObj) metrics() *agent.Metrics {
	if a.dec != nil {
		return a.dec.Metrics
	}
	return a.pre.Metrics
}

func (a *agentObj) close() {
	if a.dec != nil {
		a.dec.Close()
	}
	if a.pre != nil {
		a.pre.Close()
	}
	_ = a.plug.Close()
	if a.dec != nil { // after the plugin, which could still write them, is gone
		a.dec.ReleaseHostPages()
	}
	for _, x := range a.direct { // after the plugin let go of its import
		_ = x.Close()
	}
	if a.logf != nil {
		_ = a.logf.Close()
	}
}

// open starts the logger, the control plane's TLS and the plugin process.
func (c common) open(role agent.Role) (*agentObj, hclog.Logger, *tls.Config, error) {
	a := &agentObj{}
	level := hclog.LevelFromString(c.LogLevel)
	if c.LogLevel == "" {
		level = hclog.Warn
	} else if level == hclog.NoLevel {
		return nil, nil, nil, invalid("config: log_level %q is not trace, debug, info, warn, error or off", c.LogLevel)
	}
	out := os.Stderr
	if c.LogFile != "" {
		f, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, nil, nil, invalid("config: log_file: %v", err)
		}
		a.logf, out = f, f
	}
	log := hclog.New(&hclog.LoggerOptions{Name: agent.IdentityName(role, c.Rank), Output: out, Level: level, JSONFormat: true})
	tlsCfg, err := c.tls()
	if err != nil {
		a.close0()
		return nil, nil, nil, err
	}
	path := c.Plugin
	if path == "" {
		path = os.Getenv("KVFENCE_PLUGIN")
	}
	if path == "" {
		a.close0()
		return nil, nil, nil, invalid("config: no transport plugin: set \"plugin\" or $KVFENCE_PLUGIN (e.g. bin/kvfence-plugin-tcp)")
	}
	if a.plug, err = sdk.Open(path, sdk.OpenOptions{Env: c.PluginEnv, Logger: log.Named("plugin")}); err != nil {
		a.close0()
		return nil, nil, nil, err
	}
	if err := checkGPUMode(c.GPUMode, a.plug.Transport()); err != nil {
		a.close()
		return nil, nil, nil, err
	}
	return a, log, tlsCfg, nil
}

func (a *agentObj) close0() {
	if a.logf != nil {
		_ = a.logf.Close()
	}
}

func (c common) tls() (*tls.Config, error) {
	if c.TLSCert == "" && c.TLSKey == "" && c.TLSCA == "" {
		return nil, nil
	}
	if c.TLSCert == "" || c.TLSKey == "" || c.TLSCA == "" {
		return nil, invalid("config: tls_cert, tls_key and tls_ca go together")
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, invalid("config: tls key pair: %v", err)
	}
	caPEM, err := os.ReadFile(c.TLSCA)
	if err != nil {
		return nil, invalid("config: tls_ca: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, invalid("config: tls_ca %s holds no certificate", c.TLSCA)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}, nil
}

func openDecode(text string) (*agentObj, error) {
	var j decodeJSON
	if err := parseJSON(text, &j); err != nil {
		return nil, err
	}
	if err := checkDecodeConfig(j); err != nil {
		return nil, err
	}
	fence := j.Fence == nil || *j.Fence
	a, log, tlsCfg, err := j.open(agent.RoleDecode)
	if err != nil {
		return nil, err
	}
	cfg := agent.DecodeConfig{Rank: core.RankID(j.Rank), Slots: j.Slots, ShardBytes: j.ShardBytes, Shards: orInt(j.Shards, 1),
		Lease: ms(j.LeaseMs, 2000), MaxHold: ms(j.MaxHoldMs, 30000), ClockMargin: ms(j.ClockMarginMs, 100),
		MaxDeclaredTail: ms(j.MaxDeclaredTailMs, 0), Fence: fence, Revoke: revokeOrder(j.EagerRevoke), Checksums: j.Checksums,
		ControlAddr: j.ControlAddr, TLS: tlsCfg, Logger: log}
	if cfg.ControlAddr == "" {
		cfg.ControlAddr = "127.0.0.1:0"
	}
	a.pageBytes, a.shards = cfg.ShardBytes*int64(cfg.Shards), cfg.Shards
	if cfg.Engine, err = j.directEngine(a); err != nil {
		a.close()
		return nil, err
	}
	if a.dec, err = agent.NewDecode(context.Background(), cfg, a.plug.Transport()); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

func openPrefill(text string) (*agentObj, error) {
	var j prefillJSON
	if err := parseJSON(text, &j); err != nil {
		return nil, err
	}
	if j.DecodeAddr == "" {
		return nil, invalid("config: prefill needs decode_addr")
	}
	if err := checkPrefillConfig(j); err != nil {
		return nil, err
	}
	a, log, tlsCfg, err := j.open(agent.RolePrefill)
	if err != nil {
		return nil, err
	}
	cfg := agent.PrefillConfig{Rank: core.RankID(j.Rank), DecodeAddr: j.DecodeAddr, DecodeRank: core.RankID(j.DecodeRank), SourcePages: j.SourcePages,
		ShardBytes: j.ShardBytes, Lanes: orInt(j.Lanes, 1), QuiesceGrace: ms(j.QuiesceGraceMs, 0),
		MaxInflight: orInt(j.MaxInflight, 256), MaxBatchPages: orInt(j.MaxBatchPages, 4),
		Heartbeat: ms(j.HeartbeatMs, 200), SkewMargin: ms(j.SkewMarginMs, 50),
		RequestTombstone: ms(j.RequestTombstoneMs, 15000), BootstrapTimeout: ms(j.BootstrapTimeoutMs, 10000),
		Checksums: j.Checksums, ControlAddr: j.ControlAddr, TLS: tlsCfg, Logger: log, Events: a.plug.Events()}
	a.pageBytes = cfg.ShardBytes
	if a.pre, err = agent.NewPrefill(context.Background(), cfg, a.plug.Transport()); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}
