package conformance

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/sdk"
)

// proc is one plugin process as the suite sees it: only through the sdk
// host (sdk.Open) and through signals to its pid.
type proc struct {
	role string
	p    *sdk.Plugin
	t    sdk.Transport
	g    sdk.Granter // nil unless the plugin declared Revoke
	info sdk.Info
	// remote, when set, is a target process on the target host: p is nil
	// and t, g forward to it over the control channel (twohost_proc.go).
	remote *remoteProc
	neg    int // the negotiated protocol version
}

// open starts one plugin process, pinned to the sha256 the report names:
// the sdk runs a sealed copy of the hashed file. In a network namespace the
// copy is started through `ip netns exec NS`, which execs it in place (same
// pid, same parent), so go-plugin's unix socket and the shared-memory paths
// under /proc still work.
func (s *suite) open(ctx context.Context, role string, env []string) (*proc, error) {
	if role == "target" && s.remote != nil {
		return s.openRemote(ctx, env)
	}
	return s.openLocal(ctx, role, env)
}

// openLocal starts the process on this host (in the role's namespace, if any).
func (s *suite) openLocal(ctx context.Context, role string, env []string) (*proc, error) {
	path, opts := s.cfg.Plugin, sdk.OpenOptions{
		Env:          append(append([]string(nil), s.cfg.Env...), env...),
		Logger:       hclog.NewNullLogger(),
		StartTimeout: 30 * time.Second,
		Stderr:       prefixed(s.cfg.Log, role),
		// The suite certifies the plugin's own verdicts, class by class,
		// at the Post that earned them; the asynchronous Post hosts get by
		// default is a host-side choice that only moves the same verdict
		// into the batch's completion (covered by the sdk's tests).
		SyncPost: true,
	}
	if s.cfg.Device != "" {
		opts.Env = append(opts.Env, "KVFENCE_DEVICE="+s.cfg.Device)
	}
	opts.SHA256 = s.sum
	if ns := s.nsFor(role); ns != "" {
		opts.ExecVia = []string{"ip", "netns", "exec", ns}
		opts.Env = append(opts.Env, "KVFENCE_TCP_LISTEN="+s.net.addrFor(role)+":0")
	}
	p, err := sdk.Open(path, opts)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", role, err)
	}
	pr := &proc{role: role, p: p, t: p.Transport(), neg: p.NegotiatedVersion()}
	pr.g, _ = pr.t.(sdk.Granter)
	if pr.info, err = pr.t.Info(ctx); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("%s Info: %w", role, err)
	}
	return pr, nil
}

func (p *proc) signal(sig syscall.Signal) error {
	if p.remote != nil {
		return p.remote.signal(sig)
	}
	return syscall.Kill(p.p.Pid(), sig)
}

// stop SIGSTOPs the process and confirms it stopped (state T in
// /proc/PID/stat: kill(2) returns before the process is stopped).
func (p *proc) stop() error {
	if p.remote != nil {
		return p.remote.stop()
	}
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return waitState(p.p.Pid(), 'T', 5*time.Second)
}

// memfdMaps counts the process's mappings of the suite's shared memory.
func (p *proc) memfdMaps() int {
	if p.remote != nil {
		return p.remote.memfdMaps()
	}
	return memfdMaps(p.p.Pid())
}

// kill SIGKILLs the process and waits for the reap (process-exited).
func (p *proc) kill(timeout time.Duration) error {
	if p.remote != nil {
		return p.remote.kill(timeout)
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.p.Exited():
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s not reaped %v after SIGKILL", p.role, timeout)
	}
}

func (p *proc) close() {
	if p != nil && p.remote != nil {
		p.remote.close()
	} else if p != nil {
		_ = p.signal(syscall.SIGCONT) // a stopped process cannot die cleanly
		_ = p.p.Close()
	}
}

// alive reports whether the process answers and has not exited.
func (p *proc) alive(ctx context.Context) error {
	if p.remote != nil {
		return p.remote.alive(ctx)
	}
	select {
	case <-p.p.Exited():
		return fmt.Errorf("%s plugin process exited", p.role)
	default:
	}
	if _, err := p.t.Info(ctx); err != nil {
		return fmt.Errorf("%s plugin does not answer: %w", p.role, err)
	}
	return nil
}

type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	_, err := fmt.Fprintf(p.w, "[%s] %s", p.prefix, b)
	return len(b), err
}

func prefixed(w io.Writer, prefix string) io.Writer {
	if w == io.Discard {
		return nil
	}
	return prefixWriter{w, prefix}
}
