package mooncake

import (
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// The environment a host passes to the plugin (sdk.OpenOptions.Env).
const (
	EnvLib         = "KVFENCE_MOONCAKE_LIB"          // path of libtransfer_engine.so (else the library path)
	EnvMetadata    = "KVFENCE_MOONCAKE_METADATA"     // P2PHANDSHAKE (default) or etcd://host:port, ...
	EnvProtocol    = "KVFENCE_MOONCAKE_PROTOCOL"     // tcp (default) or rdma
	EnvHost        = "KVFENCE_MOONCAKE_HOST"         // this host's address (default: KVFENCE_TCP_LISTEN's host, else 127.0.0.1)
	EnvLocation    = "KVFENCE_MOONCAKE_LOCATION"     // registration location (default cpu:0)
	EnvFraming     = "KVFENCE_MOONCAKE_TCP_FRAMING"  // v2 (default) or legacy
	EnvReportAfter = "KVFENCE_MOONCAKE_REPORT_AFTER" // report a still-WAITING batch InDoubt after this (default 20s)
	EnvDirListen   = "KVFENCE_MOONCAKE_DIR_LISTEN"   // the key directory's listen address (default: port 0 on the engine's host)
)

// Config is the plugin's settings.
type Config struct {
	Metadata, Protocol, Host, Location string
	// Framing is what this end's TCP transport speaks. It can only
	// downgrade: a library without the acknowledged framing (no
	// getNicLoadStats: older than v0.3.12) is legacy whatever this says.
	// Mooncake also falls back to legacy framing by itself with peers
	// older than v0.3.12 and with MC_TCP_PROTO=1; such a peer's plugin
	// publishes legacy, so links to it never confirm. MC_TCP_PROTO=1 in
	// the plugin's environment forces legacy.
	Framing     string
	ReportAfter time.Duration
	DirListen   string
}

func (c Config) framing() string {
	if c.Protocol == "tcp" && c.Framing != "v2" {
		return "legacy"
	}
	return "v2"
}

// ConfigFromEnv reads the settings; a bad value is InvalidArgument.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{Metadata: "P2PHANDSHAKE", Protocol: "tcp", Host: "127.0.0.1", Location: "cpu:0", Framing: "v2", ReportAfter: nocancel.DefaultReportAfter}
	set := func(dst *string, key string) {
		if v := getenv(key); v != "" {
			*dst = v
		}
	}
	set(&c.Metadata, EnvMetadata)
	set(&c.Protocol, EnvProtocol)
	set(&c.Location, EnvLocation)
	set(&c.Framing, EnvFraming)
	if h := nocancel.ListenHost(getenv); h != "" {
		c.Host = h // a namespaced run: 127.0.0.1 is not reachable from the peer
	}
	set(&c.Host, EnvHost)
	c.DirListen = net.JoinHostPort(c.Host, "0")
	set(&c.DirListen, EnvDirListen)
	if c.Protocol != "tcp" && c.Protocol != "rdma" {
		return c, errdefs.Errorf(errdefs.InvalidArgument, "%s=%q: want tcp or rdma", EnvProtocol, c.Protocol)
	}
	if c.Framing != "v2" && c.Framing != "legacy" {
		return c, errdefs.Errorf(errdefs.InvalidArgument, "%s=%q: want v2 or legacy", EnvFraming, c.Framing)
	}
	if strings.TrimSpace(getenv("MC_TCP_PROTO")) == "1" {
		c.Framing = "legacy"
	}
	var err error
	c.ReportAfter, err = nocancel.PositiveDurationEnv(getenv, EnvReportAfter, c.ReportAfter)
	return c, err
}

// New builds the transport over a loaded backend. MaxTail is unbounded on
// both transports: over TCP a write to a stopped target waits for as long
// as it is stopped (measured); over RDMA failed slices are resent on other
// NICs and TIMEOUT tears nothing down.
func New(cfg Config, be nocancel.Backend, log hclog.Logger) (*nocancel.Transport, error) {
	return nocancel.NewVendor(nocancel.Vendor{Name: "mooncake", DirListen: cfg.DirListen, ReportAfter: cfg.ReportAfter, UnsafeEnv: EnvUnsafe}, be, log)
}

// EnvUnsafe selects a deliberately broken variant in a build with -tags
// kvfenceunsafe (tests only; a default build ignores it):
// failed-is-definite reports a batch with a FAILED task as FailedDefinite,
// which is what a plugin that trusts Mooncake's FAILED would do;
// succeed-early-after:N is honest for N batches, then reports Succeeded
// half a second before it submits.
const EnvUnsafe = "KVFENCE_MOONCAKE_UNSAFE"
