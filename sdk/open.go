package sdk

import (
	"context"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/kvfence/kvfence/errdefs"
)

// OpenOptions tune Open.
type OpenOptions struct {
	// Args are passed to the plugin binary.
	Args []string
	// Env is added to the plugin's environment (which otherwise is the host's).
	Env []string
	// SHA256, when set, pins the binary: Open copies it into a sealed
	// memfd, hashes the copy, refuses (FailedPrecondition) if the hash
	// differs, and executes that very copy — never the path again.
	SHA256 []byte
	// CertificatePolicy, when set, requires Certificate (the contents of a
	// conformance certificate file) to satisfy it for the exact sha256 of
	// the sealed copy that will run; otherwise Open refuses
	// (FailedPrecondition) with the reason.
	CertificatePolicy *CertificatePolicy
	Certificate       []byte
	// ExecVia, with pinning, runs the sealed copy through a wrapper that
	// execs its last argument in place (for example ip netns exec NS): the
	// command becomes ExecVia... /proc/self/fd/3 Args...
	ExecVia []string
	// Logger receives the host-side log and the plugin's forwarded JSON log.
	Logger hclog.Logger
	// SocketDir is where the plugin creates its unix socket. Default: a fresh
	// directory under /tmp, because a long TMPDIR makes the socket path exceed
	// the kernel's 108-byte limit and go-plugin then fails to start.
	SocketDir string
	// StartTimeout bounds the handshake. Default 30s.
	StartTimeout time.Duration
	// Stderr, if set, gets the plugin's raw stderr as well.
	Stderr io.Writer
	// SyncPost asks for the synchronous Post contract: Post waits for the
	// plugin's verdict and a refusal is Post's classified error. By
	// default Post is asynchronous on the shared-memory rings: it returns
	// once its batch is in the submission ring, and a refusal arrives as
	// the batch's one completion, FailedDefinite with the refusal's class
	// (a refused batch moved no byte). That saves a process round trip
	// per batch. Batches that do not go on the rings (gRPC data path, too
	// large for a ring record) keep the synchronous contract either way.
	// KVFENCE_ASYNC_POST=off in the host's environment has the effect of
	// SyncPost for every plugin the host opens. Plugin.AsyncPost says
	// which contract is in effect.
	SyncPost bool
	// AsyncPost is kept so that older hosts still compile.
	//
	// Deprecated: asynchronous Post is the default; it has no effect
	// (SyncPost asks for the synchronous contract).
	AsyncPost bool
}

// Plugin is a plugin process loaded by a host.
type Plugin struct {
	client    *plugin.Client
	remote    *remote
	transport Transport
	socketDir string
	ownDir    bool
	gone      chan struct{} // closed once the process is reaped
	pid       int
	closeOnce sync.Once
	closeErr  error
	closing   *atomic.Bool // Close has begun: go-plugin's kill is ours (quietClose)
	proto     plugin.ClientProtocol
}

// exitGrace is how long Close waits for the plugin to exit on its own once
// asked, before go-plugin kills it. go-plugin's own wait is 2 s, which a
// loaded machine can outlast.
const exitGrace = 15 * time.Second

// Open starts the plugin binary at path and connects to it: gRPC only,
// protocol versions negotiated (VersionedPlugins), AutoMTLS on the plugin
// socket, optional sha256 pinning, and managed by go-plugin (CleanupClients
// kills it). The plugin is killed by the kernel if the host dies (Pdeathsig)
// and exits by itself if its parent changes.
func Open(path string, opts OpenOptions) (*Plugin, error) {
	async, err := AsyncPostFromEnv(!opts.SyncPost)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "Open %s: %v", path, err)
	}
	logger := opts.Logger
	if logger == nil {
		logger = hclog.New(&hclog.LoggerOptions{Name: "kvfence-host", Level: hclog.Error, Output: os.Stderr})
	}
	dir, own := opts.SocketDir, false
	if dir == "" {
		d, err := os.MkdirTemp("/tmp", "kvf")
		if err != nil {
			return nil, errdefs.Errorf(errdefs.Unavailable, "Open: socket dir: %v", err)
		}
		dir, own = d, true
	}
	cmd, afterStart, err := pluginCommand(path, opts, dir)
	if err != nil {
		return nil, removeOwn(dir, own, err)
	}
	tail, closing := &stderrTail{}, &atomic.Bool{}
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: versionedPlugins(nil),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Managed:          true,
		SkipHostEnv:      true, // pluginEnv already copied it, minus what we own
		Logger:           quietClose{Logger: logger, closing: closing},
		StartTimeout:     opts.StartTimeout,
		Stderr:           stderrTo(opts.Stderr, tail),
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: dir},
		GRPCDialOptions:  []grpc.DialOption{},
		RunnerFunc:       runnerFunc(cmd, afterStart...),
	}
	p := &Plugin{client: plugin.NewClient(cfg), socketDir: dir, ownDir: own, gone: make(chan struct{}), closing: closing}
	if err := p.connect(path, cmd, tail, async); err != nil {
		return nil, err
	}
	go p.watchExit()
	return p, nil
}

// pluginCommand is how the plugin is started: the binary at path, or,
// pinned (SHA256 or CertificatePolicy), the sealed copy whose pins it
// verified, run through ExecVia's wrapper when asked. afterStart are the
// files the runner closes once the plugin started.
func pluginCommand(path string, opts OpenOptions, dir string) (cmd *exec.Cmd, afterStart []*os.File, err error) {
	cmd = exec.Command(path, opts.Args...)
	cmd.Env = pluginEnv(opts.Env, dir)
	// SIGKILL the plugin if the host dies; the plugin's own parent watch
	// covers the case where the kernel does not deliver it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if len(opts.SHA256) == 0 && opts.CertificatePolicy == nil {
		if len(opts.ExecVia) > 0 {
			return nil, nil, errdefs.Errorf(errdefs.InvalidArgument, "Open: ExecVia needs a pinned binary (SHA256 or CertificatePolicy)")
		}
		return cmd, nil, nil
	}
	sealed, err := sealBinary(path)
	if err != nil {
		return nil, nil, err
	}
	if err := sealed.verifyPins(path, opts); err != nil {
		sealed.f.Close()
		return nil, nil, err
	}
	cmd.Path, cmd.Err, cmd.ExtraFiles = sealedExecPath, nil, []*os.File{sealed.f}
	if len(opts.ExecVia) > 0 {
		wrapper, err := exec.LookPath(opts.ExecVia[0])
		if err != nil {
			sealed.f.Close()
			return nil, nil, errdefs.Errorf(errdefs.NotFound, "Open: %v", err)
		}
		cmd.Path = wrapper
		cmd.Args = append(append(append([]string(nil), opts.ExecVia...), sealedExecPath), opts.Args...)
	}
	return cmd, cmd.ExtraFiles, nil
}

// connect completes the handshake, dispenses the transport and sets up
// the host's end (rings negotiated, Post contract chosen). On failure the
// plugin is killed, Open's socket directory removed, and the error carries
// the plugin's own last line on stderr.
func (p *Plugin) connect(path string, cmd *exec.Cmd, tail *stderrTail, async bool) error {
	fail := func(class errdefs.Class, format string, args ...any) error {
		p.client.Kill() // after it, the plugin's stderr is read to its end
		p.removeDir()
		if why := tail.last(); why != "" {
			format, args = format+" (the plugin's last line on stderr: %s)", append(args, why)
		}
		return errdefs.Errorf(class, format, args...)
	}
	proto, err := p.client.Client()
	if err != nil {
		p.client.Kill()
		p.removeDir()
		return startFailure(path, err, tail.last())
	}
	raw, err := proto.Dispense(pluginName)
	if err != nil {
		return fail(errdefs.Unimplemented, "Open %s: %v", path, err)
	}
	conn, ok := raw.(*grpc.ClientConn)
	if !ok {
		return fail(errdefs.Internal, "Open %s: unexpected client %T", path, raw)
	}
	p.pid = cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := newRemote(ctx, conn, p.gone)
	if err != nil {
		return fail(errdefs.ClassOf(err), "Open %s: %v", path, err)
	}
	r.onLost = func() { go p.reap() }
	r.setAsyncPost(async)
	p.remote, p.transport, p.proto = r, r.asTransport(), proto
	return nil
}

// removeOwn removes a socket directory Open made before failing.
func removeOwn(dir string, own bool, err error) error {
	if own {
		_ = os.RemoveAll(dir)
	}
	return err
}

// pluginEnv is the host's environment without the keys we set, plus ours.
// (exec keeps the last of duplicate keys, so order matters less than
// removing them: a host that is itself a plugin must not leak its own.)
func pluginEnv(extra []string, socketDir string) []string {
	own := []string{
		plugin.EnvUnixSocketDir + "=" + socketDir,
		envHostPID + "=" + strconv.Itoa(os.Getpid()),
	}
	skip := map[string]bool{plugin.EnvUnixSocketDir: true, envHostPID: true}
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !skip[k] {
			env = append(env, kv)
		}
	}
	env = append(env, extra...)
	return append(env, own...)
}

// watchExit turns the reaping of the process into process-exited evidence.
// go-plugin reaps the child in its own goroutine and exposes only Exited().
func (p *Plugin) watchExit() {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for range t.C {
		if p.client.Exited() {
			close(p.gone)
			// The process's sockets are gone, so its completion stream
			// ends now; wait for that first: the stream's end declares the
			// outstanding batches in doubt, and the exit evidence must
			// cover them (a reap seen first gave evidence for none).
			select {
			case <-p.remote.streamDone:
			case <-time.After(10 * time.Second):
			}
			p.remote.processExited()
			return
		}
	}
}

// reap kills a plugin whose stream we lost: we no longer trust it, and only
// its death turns its in-doubt batches into quiesced ones. Not during
// Close, which asked the plugin to exit and gives it exitGrace first.
func (p *Plugin) reap() {
	if p.closing.Load() {
		return
	}
	p.client.Kill()
}

// Transport is the plugin's transport. It implements Granter iff the plugin
// declared Capabilities.Revoke, and StatsReporter always.
func (p *Plugin) Transport() Transport { return p.transport }

// Events reports plugin loss, exit (with process-exited evidence) and
// protocol violations. Restarting a lost plugin is the caller's decision.
func (p *Plugin) Events() <-chan Event { return p.remote.events }

// Exited is closed once the plugin process has been reaped.
func (p *Plugin) Exited() <-chan struct{} { return p.gone }

// Pid is the plugin's process id.
func (p *Plugin) Pid() int { return p.pid }

// NegotiatedVersion is the protocol version host and plugin agreed on.
func (p *Plugin) NegotiatedVersion() int { return p.client.NegotiatedVersion() }

// Close stops the transport (pending batches complete InDoubt), kills the
// process, and waits for it to be reaped.
func (p *Plugin) Close() error {
	p.closeOnce.Do(func() {
		p.closing.Store(true)
		p.closeErr = p.remote.Close()
		_ = p.proto.Close() // go-plugin's Shutdown: the plugin's Serve returns and it exits
		select {
		case <-p.gone:
		case <-time.After(exitGrace):
		}
		p.client.Kill() // its cleanup; a kill only if the plugin is still there
		<-p.gone
		p.removeDir()
	})
	return p.closeErr
}

// startFailure is Open's refusal of a plugin that did not start: its own
// reason (its last line on stderr) first, go-plugin's first line after it.
func startFailure(path string, err error, why string) error {
	if why == "" {
		return errdefs.Errorf(errdefs.Unavailable, "Open %s: %v", path, err)
	}
	generic, _, _ := strings.Cut(err.Error(), "\n")
	return errdefs.Errorf(errdefs.Unavailable, "Open %s: the plugin did not start: %s (go-plugin: %s)", path, why, strings.TrimSpace(generic))
}

func (p *Plugin) removeDir() {
	if p.ownDir {
		_ = os.RemoveAll(p.socketDir)
	}
}

// FileSHA256 is a helper for pinning: the sha256 of the file at path.
func FileSHA256(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.NotFound, "FileSHA256: %v", err)
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}
