package sdk

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
)

// groupRunner starts a plugin in a process group of its own, with its
// stdout and stderr on pipes the host holds the read ends of. go-plugin's
// own runner waits for end-of-file on those pipes before it reaps, so a
// plugin whose child keeps stdout open held a failed start (and every
// Kill) until that child exited — minutes past StartTimeout. Kill here
// SIGKILLs the whole group and closes the read ends, so a start times out
// when it should and Kill returns.
type groupRunner struct {
	cmd            *exec.Cmd
	stdout, stderr *os.File // read ends
	writeEnds      []*os.File
	afterStart     []*os.File // closed once the child has them
	killOnce       sync.Once
}

var _ runner.Runner = (*groupRunner)(nil)

// pipeGrace is how long Kill lets the plugin's pipes drain before it
// closes the host's ends.
const pipeGrace = time.Second

func newGroupRunner(cmd *exec.Cmd, closeAfterStart ...*os.File) (*groupRunner, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_, _ = outR.Close(), outW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	return &groupRunner{cmd: cmd, stdout: outR, stderr: errR, writeEnds: []*os.File{outW, errW}, afterStart: closeAfterStart}, nil
}

// runnerFunc adapts newGroupRunner to go-plugin's ClientConfig.RunnerFunc:
// go-plugin hands over a spec command carrying its environment (handshake,
// socket directory, TLS certificate) and stdin; cmd is what runs.
func runnerFunc(cmd *exec.Cmd, closeAfterStart ...*os.File) func(hclog.Logger, *exec.Cmd, string) (runner.Runner, error) {
	return func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
		cmd.Env = append(cmd.Env, spec.Env...)
		cmd.Stdin = spec.Stdin
		return newGroupRunner(cmd, closeAfterStart...)
	}
}

func (r *groupRunner) Start(context.Context) error {
	err := r.cmd.Start()
	for _, f := range append(r.writeEnds, r.afterStart...) {
		_ = f.Close() // the child has its copies
	}
	if err != nil {
		_, _ = r.stdout.Close(), r.stderr.Close()
	}
	return err
}

func (r *groupRunner) Wait(context.Context) error { return r.cmd.Wait() }

// Kill SIGKILLs the plugin's process group (its children too) and closes
// the host's ends of its pipes, whoever still holds the other ends.
func (r *groupRunner) Kill(context.Context) error {
	p := r.cmd.Process
	if p == nil {
		return nil
	}
	r.killOnce.Do(func() {
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		_ = p.Kill()
		// With the group dead the pipes end by themselves; a child that left
		// the group may still hold them, so close our ends after a grace
		// period (not at once: that would cut off the plugin's last words).
		time.AfterFunc(pipeGrace, func() { _, _ = r.stdout.Close(), r.stderr.Close() })
	})
	return nil
}

func (r *groupRunner) Stdout() io.ReadCloser { return r.stdout }
func (r *groupRunner) Stderr() io.ReadCloser { return r.stderr }
func (r *groupRunner) Name() string          { return r.cmd.Args[0] }
func (r *groupRunner) Diagnose(context.Context) string {
	return "the plugin must print the go-plugin handshake line on stdout within the start timeout"
}

func (r *groupRunner) ID() string {
	if r.cmd.Process == nil {
		return ""
	}
	return strconv.Itoa(r.cmd.Process.Pid)
}

func (r *groupRunner) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (r *groupRunner) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }
