package nixl

import (
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// The environment a host passes to the plugin.
const (
	EnvLib         = "KVFENCE_NIXL_LIB"            // path of libnixl_capi.so (else the library path)
	EnvBackend     = "KVFENCE_NIXL_BACKEND"        // NIXL backend plugin (default UCX)
	EnvReportAfter = "KVFENCE_NIXL_REPORT_AFTER"   // report a request still IN_PROG as InDoubt after this (default 20s)
	EnvProgress    = "KVFENCE_NIXL_PROGRESS_DELAY" // longest sleep of NIXL's progress thread between polls (default 1ms; NIXL's own 0 spins a core)
	EnvDirListen   = "KVFENCE_NIXL_DIR_LISTEN"     // the key directory's listen address (default: port 0 on KVFENCE_TCP_LISTEN's host, else 127.0.0.1:0)
)

// Config is the plugin's settings.
type Config struct {
	Backend     string
	ReportAfter time.Duration
	DirListen   string
	// ProgressDelay is the progress thread's poll timeout, where the
	// library can be given one (nixl_capi_create_configured_agent).
	ProgressDelay time.Duration
}

// sharedMemoryTLS are UCX transports by which the initiator writes the
// target's memory itself (shared memory, CMA, XPMEM, KNEM, GPU IPC): no
// byte passes through the target process, so ending that process does not
// stop them, and a post can report SUCCESS at once. Refused.
var sharedMemoryTLS = []string{"all", "sm", "shm", "posix", "sysv", "mm", "xpmem", "cma", "knem", "cuda_ipc", "rocm_ipc", "ze_ipc"}

// CheckUCXTransports refuses a UCX_TLS that allows shared-memory
// transports; UCX_TLS must name the transports explicitly (tcp; rc, ud,
// dc and their variants for RDMA).
func CheckUCXTransports(tls string) error {
	if strings.TrimSpace(tls) == "" {
		return errdefs.Errorf(errdefs.FailedPrecondition, "nixl: UCX_TLS is not set, so UCX may use shared memory between processes on one host (the initiator then writes target memory directly and ending the target process does not fence it); set UCX_TLS=tcp (or rc,tcp on RDMA)")
	}
	if strings.HasPrefix(strings.TrimSpace(tls), "^") {
		return errdefs.Errorf(errdefs.FailedPrecondition, "nixl: UCX_TLS=%s excludes transports instead of naming them; name them (UCX_TLS=tcp or rc,tcp)", tls)
	}
	for _, t := range strings.Split(tls, ",") {
		t = strings.ToLower(strings.TrimSpace(t))
		for _, bad := range sharedMemoryTLS {
			if t == bad || strings.HasPrefix(t, bad+"_") {
				return errdefs.Errorf(errdefs.FailedPrecondition, "nixl: UCX_TLS=%s allows %s, a transport by which the initiator writes target memory directly (not fenced by ending the target process); remove it", tls, t)
			}
		}
	}
	return nil
}

// ConfigFromEnv reads the settings (UCX_TLS is checked by Load, once the
// library is known to be there).
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{Backend: "UCX", ReportAfter: nocancel.DefaultReportAfter, DirListen: nocancel.DirListenDefault(getenv)}
	if v := getenv(EnvDirListen); v != "" {
		c.DirListen = v
	}
	if v := getenv(EnvBackend); v != "" {
		c.Backend = v
	}
	if c.Backend != "UCX" {
		return c, errdefs.Errorf(errdefs.InvalidArgument, "%s=%q: only UCX is supported", EnvBackend, c.Backend)
	}
	c.ProgressDelay = time.Millisecond
	if v := getenv(EnvProgress); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Microsecond {
			return c, errdefs.Errorf(errdefs.InvalidArgument, "%s=%q: want a duration of at least 1us (0 makes the progress thread spin)", EnvProgress, v)
		}
		c.ProgressDelay = d
	}
	var err error
	c.ReportAfter, err = nocancel.PositiveDurationEnv(getenv, EnvReportAfter, c.ReportAfter)
	return c, err
}

// New builds the transport. MaxTail is unbounded: NIXL has no timeout (a
// request to a stopped target stays IN_PROG for as long as it is stopped)
// and releasing a request does not cancel it.
func New(cfg Config, be nocancel.Backend, log hclog.Logger) (*nocancel.Transport, error) {
	return nocancel.NewVendor(nocancel.Vendor{Name: "nixl", DirListen: cfg.DirListen, ReportAfter: cfg.ReportAfter, UnsafeEnv: EnvUnsafe}, be, log)
}

// EnvUnsafe selects a deliberately broken variant in a build with -tags
// kvfenceunsafe (tests only; a default build ignores it):
// failed-is-definite reports a batch whose request failed (ERROR_BACKEND) as FailedDefinite,
// which is what a plugin that trusts NIXL's errors would do.
const EnvUnsafe = "KVFENCE_NIXL_UNSAFE"
