package mori

import (
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// The environment a host passes to the plugin.
const (
	EnvShim        = "KVFENCE_MORI_SHIM"         // path of libkvfence_mori_shim.so (make mori-shim)
	EnvHost        = "KVFENCE_MORI_HOST"         // the engine's out-of-band address (default 127.0.0.1)
	EnvPort        = "KVFENCE_MORI_PORT"         // its port (default 0: any)
	EnvReportAfter = "KVFENCE_MORI_REPORT_AFTER" // report a write still in progress as InDoubt after this (default 20s)
	EnvDirListen   = "KVFENCE_MORI_DIR_LISTEN"   // the key directory's listen address
)

// Config is the plugin's settings.
type Config struct {
	Host, Backend string
	Port          int
	ReportAfter   time.Duration
	DirListen     string
}

// ConfigFromEnv reads the settings.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{Host: "127.0.0.1", Backend: "rdma", ReportAfter: nocancel.DefaultReportAfter, DirListen: getenv(EnvDirListen)}
	if v := getenv(EnvHost); v != "" {
		c.Host = v
	}
	if v := getenv(EnvPort); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil || p < 0 || p > 65535 {
			return c, errdefs.Errorf(errdefs.InvalidArgument, "%s=%q: want a port", EnvPort, v)
		}
		c.Port = p
	}
	var err error
	c.ReportAfter, err = nocancel.PositiveDurationEnv(getenv, EnvReportAfter, c.ReportAfter)
	return c, err
}

// New builds the transport. MaxTail is unbounded: MORI cannot cancel, a
// failed write's other queue pairs may still be writing, and its retry
// timeouts depend on the NIC (34 s per try on some).
func New(cfg Config, be nocancel.Backend, log hclog.Logger) (*nocancel.Transport, error) {
	return nocancel.NewVendor(nocancel.Vendor{Name: "mori", DirListen: cfg.DirListen, ReportAfter: cfg.ReportAfter, UnsafeEnv: EnvUnsafe}, be, log)
}

// EnvUnsafe selects a deliberately broken variant in a build with -tags
// kvfenceunsafe (tests only; a default build ignores it):
// failed-is-definite reports a batch with a failed write as FailedDefinite,
// which is what a plugin that trusts MORI's first error would do.
const EnvUnsafe = "KVFENCE_MORI_UNSAFE"
