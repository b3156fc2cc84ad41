package sdk

import (
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// envHostPID carries the host's pid to the plugin so the plugin can notice
// that its host died (go-plugin alone leaves the plugin running as an orphan).
const envHostPID = "KVFENCE_HOST_PID"

// hostWatchInterval is how often a plugin checks that its host is alive.
const hostWatchInterval = 200 * time.Millisecond

// ServeOptions tune Serve. The zero value is right for most plugins.
type ServeOptions struct {
	// Logger for the plugin; default: hclog JSON on stderr, which go-plugin
	// forwards into the host's log with levels intact.
	Logger hclog.Logger
}

// Serve runs impl as a kvfence plugin: it speaks kvfence.transport.v1 over
// go-plugin's gRPC on a unix socket, and never returns. It exits when the
// host closes it, and also when the host dies (it checks its parent pid), so
// no orphan keeps moving bytes — once the plugin is gone, the kernel tears
// its sockets down, which is what the host's process-exited evidence means.
func Serve(impl Transport, opts ServeOptions) {
	logger := opts.Logger
	if logger == nil {
		logger = NewPluginLogger("kvfence-plugin")
	}
	go watchHost(logger)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: versionedPlugins(impl),
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           logger,
	})
	_ = impl.Close()
	os.Exit(0)
}

// NewPluginLogger is the logger plugins should use: JSON on stderr (go-plugin
// parses it on the host side), level from KVFENCE_LOG_LEVEL (default info).
func NewPluginLogger(name string) hclog.Logger {
	level := hclog.LevelFromString(os.Getenv("KVFENCE_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Output: os.Stderr, JSONFormat: true, Level: level})
}

// watchHost exits the process as soon as its parent is no longer the host
// that started it (re-parented to init or a subreaper). The host also asks
// the kernel for SIGKILL on its death (Pdeathsig); this covers the cases
// where that signal is not delivered (it follows the parent *thread*).
func watchHost(logger hclog.Logger) {
	want, err := strconv.Atoi(os.Getenv(envHostPID))
	if err != nil || want <= 0 {
		want = os.Getppid()
	}
	for {
		if os.Getppid() != want {
			// Exit without a graceful Close: nobody is left to read
			// completions, and exiting is what stops our bytes fastest.
			logger.Error("host process is gone; exiting", "host_pid", want)
			os.Exit(3)
		}
		time.Sleep(hostWatchInterval)
	}
}
