package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo"
	"github.com/kvfence/kvfence/plugins/catalog"
	"github.com/kvfence/kvfence/sdk"
)

// pluginFlagHelp is the help text of --plugin in demo, bench and __agent.
const pluginFlagHelp = "transport plugin: tcp (embedded, the default), verbs, mooncake, nixl, mori (bin/kvfence-plugin-NAME beside this executable or in ./bin; make plugins), or a path to a plugin binary"

// resolvePluginFlag turns --plugin into the binary to run: "" for the
// embedded TCP plugin (this executable's __plugin-tcp), else an absolute
// path, so that rank processes started elsewhere run the same file. Bad
// values are usage errors (exit 2) before any work starts.
func resolvePluginFlag(value string) (string, error) {
	if value == "" || value == "tcp" {
		return "", nil
	}
	path, err := catalog.Resolve(value, catalog.DefaultDirs()...)
	if err != nil {
		if value == "verbs" && errdefs.Is(err, errdefs.NotFound) {
			// make plugins leaves verbs out: it needs cgo and rdma-core.
			err = fmt.Errorf("--plugin verbs: kvfence-plugin-verbs not found in %s; build it with CGO_ENABLED=1 go build -tags rdma -o bin/kvfence-plugin-verbs ./plugins/verbs/cmd/kvfence-plugin-verbs (needs libibverbs-dev)",
				strings.Join(catalog.DefaultDirs(), ", "))
		}
		return "", usageError{err}
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return path, nil
}

// openPlugin starts a rank's transport plugin: the embedded TCP one when
// path is "", else the binary at path. A plugin that exits before its
// handshake (a vendor plugin without its library) has printed one
// classified line on stderr saying why; that line is the error, rather
// than go-plugin's "Unrecognized remote plugin message".
func openPlugin(path string, env []string, pins sdk.PluginPins, log hclog.Logger) (*sdk.Plugin, error) {
	exe, popts := path, sdk.OpenOptions{Logger: log.Named("plugin"), Env: append([]string{"KVFENCE_LOG_LEVEL=warn"}, env...)}
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		exe, popts.Args = self, []string{"__plugin-tcp"}
	}
	if err := pins.Apply(&popts); err != nil {
		return nil, err
	}
	if len(popts.SHA256) == 0 && popts.CertificatePolicy == nil {
		// Unpinned by configuration: pin to the binary as it is now, so
		// that what runs is the sealed copy of exactly the file hashed here
		// and logged (no check-then-exec window), never a file swapped in
		// between.
		sum, err := sdk.FileSHA256(exe)
		if err != nil {
			return nil, err
		}
		popts.SHA256 = sum
		log.Info("plugin pinned to its sha256 at start", "plugin", exe, "sha256", hex.EncodeToString(sum))
	}
	said := &lastLine{}
	popts.Stderr = said
	plug, err := sdk.Open(exe, popts)
	if err == nil {
		log.Info("transport plugin open", "plugin", exe, "data_path", plug.DataPath(), "async_post", plug.AsyncPost())
		return plug, nil
	}
	if line := said.wait(time.Second); line != "" {
		return nil, fmt.Errorf("transport plugin %s: %s", filepath.Base(exe), line)
	}
	return nil, fmt.Errorf("open the transport plugin %s: %w", exe, err)
}

// preflightPlugin opens the chosen plugin once, with the environment the
// decode rank will give it, before the demo or bench starts any rank: a
// plugin that cannot start fails here with its own line, and one the demo
// cannot run safely is refused with the reason.
func preflightPlugin(flag, path string, env []string, abortShare float64, restartFence bool) (sdk.Capabilities, error) {
	if path == "" {
		// The embedded TCP plugin revokes and has a bounded tail.
		return sdk.Capabilities{Revoke: true}, nil
	}
	plug, err := openPlugin(path, env, sdk.PluginPins{}, hclog.NewNullLogger())
	if err != nil {
		return sdk.Capabilities{}, err
	}
	defer plug.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := plug.Transport().Info(ctx)
	if err != nil {
		return sdk.Capabilities{}, fmt.Errorf("transport plugin %s: Info: %w", filepath.Base(path), err)
	}
	return info.Capabilities, demoCanRun(flag, info, abortShare, restartFence)
}

// demoCanRun refuses a transport the demo cannot show safe within a run:
// one that cannot revoke (so decode runs without the per-exposure fence,
// agent/decode.go) and whose writes may land longer than the core's
// default bound on declared tails. Decode accepts such ranks (its own tail
// raises that bound), and an aborted request whose writes went in doubt
// (FAILED, WAITING) then keeps its pages until that tail passes: the run
// would wait on it. The restart fence (--restart-fence-instances, issue 14
// item 4: reap the target plugin) bounds such holds, so with it the demo
// runs. Without aborts nothing is held, so --abort-share 0 runs too.
func demoCanRun(flag string, info sdk.Info, abortShare float64, restartFence bool) error {
	c := info.Capabilities
	if c.Revoke || c.MaxTail <= core.DefaultMaxDeclaredTail || abortShare == 0 || restartFence {
		return nil
	}
	return usagef("--plugin %s: transport %s cannot revoke a window and declares a write tail of %s (bytes may land that long after a failure); "+
		"an aborted request whose writes go in doubt would keep its pages that long and the run would wait on it, so the demo refuses; "+
		"--restart-fence-instances N bounds such holds (decode reaps the target plugin instance that served them), --abort-share 0 runs it without aborts", flag, info.Name, humanTail(c.MaxTail))
}

// humanTail prints a tail in the largest unit that reads well.
func humanTail(d time.Duration) string {
	const year = 365 * 24 * time.Hour
	if d >= year {
		return fmt.Sprintf("~%d years", d/year)
	}
	return d.String()
}

// lastLine keeps the last plain (non-JSON) line a plugin wrote on stderr:
// the one-line reason a plugin gives when it exits before its handshake.
type lastLine struct {
	mu      sync.Mutex
	partial []byte
	line    string
}

func (l *lastLine) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		s := strings.TrimSpace(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		if s != "" && !strings.HasPrefix(s, "{") {
			l.line = s
		}
	}
}

// wait returns the line, giving go-plugin's stderr reader up to d to pass
// on what the exited plugin wrote.
func (l *lastLine) wait(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		l.mu.Lock()
		s := l.line
		l.mu.Unlock()
		if s != "" || time.Now().After(deadline) {
			return s
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// choosePlugin resolves o.Plugin (--plugin) to the binary every rank runs
// and preflights it; demo and bench call it after their flags are checked
// and before anything starts. A transport that cannot revoke runs without
// the per-exposure fence (decode turns it off, agent/decode.go), and the
// summary says so.
func choosePlugin(o *demo.Options) error {
	flag := o.Plugin
	path, err := resolvePluginFlag(flag)
	if err != nil {
		return err
	}
	o.Plugin = path
	caps, err := preflightPlugin(flag, path, o.DecodeEnv, o.AbortShare, o.RestartInstances > 0)
	if err != nil {
		return err
	}
	o.Fence = o.Fence && caps.Revoke
	return nil
}
