package demo

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// child is one rank process (kvfence __agent) and the addresses it
// printed on its READY line.
type child struct {
	cmd     *exec.Cmd
	control string
	metrics string
}

// startPrefills starts prefill ranks 1 and 2 against decode's control
// address; the returned func stops them.
func startPrefills(ctx context.Context, exe, decode string, args []string, dir string) ([]*child, func(), error) {
	var pre []*child
	stop := func() {
		for i := len(pre) - 1; i >= 0; i-- {
			pre[i].stop()
		}
	}
	for r := 1; r <= 2; r++ {
		c, err := startChild(ctx, exe, append([]string{"--role", "prefill", "--rank", fmt.Sprint(r), "--decode", decode}, args...),
			fmt.Sprintf("prefill-%d.log", r), dir)
		if err != nil {
			stop()
			return nil, nil, err
		}
		pre = append(pre, c)
	}
	return pre, stop, nil
}

// startChild starts exe __agent with args, logging to dir/logName, and
// waits (up to a minute) for its READY line.
func startChild(ctx context.Context, exe string, args []string, logName string, dir string) (*child, error) {
	cmd := exec.CommandContext(ctx, exe, append([]string{"__agent", "--log", filepath.Join(dir, logName)}, args...)...)
	cmd.Stderr = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lines := bufio.NewScanner(out)
	ready := make(chan []string, 1)
	go func() {
		for lines.Scan() {
			if f := strings.Fields(lines.Text()); len(f) == 3 && f[0] == "READY" {
				ready <- f
			}
		}
		close(ready)
	}()
	select {
	case f, ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			return nil, fmt.Errorf("%s exited before it was ready (see %s)", logName, filepath.Join(dir, logName))
		}
		return &child{cmd: cmd, control: f[1], metrics: f[2]}, nil
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%s not ready after 60s", logName)
	}
}

// stop asks the rank to end (SIGTERM) and kills it after 5 s.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// maybeTLS is the named identity's TLS config from the run's throwaway
// PKI, or nil without TLS.
func maybeTLS(on bool, dir, name string) (*tls.Config, error) {
	if !on {
		return nil, nil
	}
	return LoadTLS(filepath.Join(dir, "pki"), name)
}

// PKINames are the identities a run with prefills prefill ranks needs
// certificates for.
func PKINames(prefills int) []string {
	names := []string{"router", "decode-0"}
	for i := 1; i <= prefills; i++ {
		names = append(names, fmt.Sprintf("prefill-%d", i))
	}
	return names
}

// prepareRun fills in the run directory (a new temp dir named after
// prefix when o.Dir is empty), returns the agent binary, and, with TLS,
// writes throwaway certificates and returns the --pki flag for the agents.
func prepareRun(o *Options, prefix string) (exe string, pkiArgs []string, err error) {
	if o.Dir == "" {
		if o.Dir, err = os.MkdirTemp("", prefix); err != nil {
			return "", nil, err
		}
	}
	if exe = o.Exe; exe == "" {
		if exe, err = os.Executable(); err != nil {
			return "", nil, err
		}
	}
	if o.TLS {
		pki := filepath.Join(o.Dir, "pki")
		if err := os.MkdirAll(pki, 0o700); err != nil {
			return "", nil, err
		}
		if err := WriteThrowawayPKI(pki, PKINames(2)); err != nil {
			return "", nil, err
		}
		pkiArgs = []string{"--pki", pki}
	}
	return exe, pkiArgs, nil
}
