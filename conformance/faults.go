package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// fault is a real fault on the link or a process: apply starts it and
// reports whether it took effect, release ends it. underFault says Quiesce
// may be asked while it holds (the plugin's control path is not affected
// by it). A fault that could not be applied (the plugin's link does not
// pass through the proxy) is no evidence either way: apply then returns a
// skip, so the required check is NOT RUN and the run partial (no
// certificate), never a pass and never a failure. carried, when set, is
// asked after a write of n bytes completed Succeeded with its bytes in
// place: a skip if those bytes did not take the faulted link. reached,
// when set, is asked after any other outcome (a refused Post,
// FailedDefinite, InDoubt): a skip if the fault never touched the write's
// bytes, so a plugin whose data goes around the fault (a decoy connection
// through the proxy) cannot pass a fault it never saw by reporting failure.
type fault struct {
	name       string
	apply      func() error
	release    func()
	underFault bool
	carried    func(n uint64) error
	reached    func(n uint64) error
	// settle, when set, is asked after release: how much longer bytes the
	// fault held back may still take to land. A kernel blackhole leaves
	// them to TCP's retransmission timer (the sockets' RTO, read as it is
	// released), where a proxy delivers them at once.
	settle func() time.Duration
}

// watchAfter is the guard window after f is released.
func (f fault) watchAfter(guard time.Duration) time.Duration {
	if f.settle == nil {
		return guard
	}
	return guard + f.settle()
}

// reachedFloor is how much of an n-byte write must have entered a fault
// for a non-Succeeded outcome to count as the plugin's answer to it: one
// page, never more than the write. An idle decoy connection sends none,
// and a decoy's heartbeat byte is not a page. A stalled proxy takes one
// read, then holds, and that read may be a plugin's frame header alone
// (the minimal example's is 36 bytes): what entered a stall also counts
// the peak of bytes queued unread behind it (Proxy.StallPeak).
func reachedFloor(n uint64) uint64 { return min(n, 4096) }

// notThroughProxy: the proxy fault touched nothing the plugin's data uses.
func notThroughProxy(kind, what string) error {
	return errSkip("proxy %s not applied: %s; the plugin's data does not pass through the in-path proxy (its endpoint is not its data address): run with --netns (or --netem-dev) to fault its real link", kind, what)
}

// linkFault is fault kind ("delay", "stall", "drop", "reset") on the
// session's link: wherever the run has a veth pair between two namespaces
// (--netns on one host, --two-host), the kernel's on that link, which
// reaches every connection the plugin opens, whatever its transport does
// with them (twohost_link.go); on plain loopback the in-path proxy's,
// which reaches only connections made to the endpoint address. during,
// when set, is called while the write is on the faulted link (reset: the
// reset itself).
func (se *session) linkFault(kind string) (f fault, during func(), err error) {
	if se.s.net != nil {
		return se.s.net.kernelFault(kind)
	}
	if se.s.hosts != nil {
		return fault{}, nil, errSkip("kernel faults on the link to a target host on another machine are not implemented: the link-fault checks need --two-host's namespaces (or the proxy, on one host)")
	}
	f = se.proxyFault(kind)
	if kind != "reset" {
		return f, nil, nil
	}
	// A reset that found no connection open is no evidence either way.
	p, resetN := se.proxy, -1
	during = func() { time.Sleep(20 * time.Millisecond); resetN = p.Reset() }
	reached, carried := f.reached, f.carried
	f.reached = func(n uint64) error {
		if resetN == 0 {
			return notThroughProxy(kind, "no connection was open to reset during the write")
		}
		return reached(n)
	}
	f.carried = func(n uint64) error {
		if resetN == 0 {
			return notThroughProxy(kind, "no connection was open to reset during the write")
		}
		return carried(n)
	}
	return f, during, nil
}

// proxyFault is one of the in-path proxy's faults on the session's link.
func (se *session) proxyFault(kind string) fault {
	p := se.proxy
	var sentAt, enteredAt uint64
	links := func(n int) error {
		sentAt, enteredAt = p.Sent(), p.Entered()
		if n == 0 {
			return notThroughProxy(kind, "it hit no connection")
		}
		return nil
	}
	f := fault{name: "proxy " + kind, release: p.Release}
	f.carried = func(n uint64) error {
		if got := p.Sent() - sentAt; got < n {
			return notThroughProxy(kind, fmt.Sprintf("a %d-byte write completed Succeeded with its bytes in place, but only %d bytes crossed the proxy", n, got))
		}
		return nil
	}
	f.reached = func(n uint64) error {
		got := p.Entered() - enteredAt
		if kind == "stall" {
			got += p.StallPeak()
		}
		if got < reachedFloor(n) {
			return notThroughProxy(kind, fmt.Sprintf("a %d-byte write ended without Succeeded, but only %d bytes entered the faulted proxy (at least %d must have)", n, got, reachedFloor(n)))
		}
		return nil
	}
	switch kind {
	case "delay":
		f.apply = func() error { p.SetDelay(2 * time.Millisecond); return links(p.Links()) }
		f.release, f.underFault = func() { p.SetDelay(0) }, false
	case "reset": // the link is slowed so that the write is still on it when the check resets it
		f.apply = func() error { p.SetDelay(time.Millisecond); return links(p.Links()) }
		f.release, f.underFault = func() { p.SetDelay(0) }, false
	case "stall":
		f.apply, f.underFault = func() error { return links(p.Stall()) }, true
	case "drop":
		f.apply, f.underFault = func() error { return links(p.Drop()) }, true
	}
	return f
}

// stopFault SIGSTOPs a process and confirms it stopped (state T in
// /proc/PID/stat: kill(2) returns before the process is stopped).
func stopFault(p *proc) fault {
	return fault{name: "SIGSTOP " + p.role,
		apply:   p.stop,
		release: func() { _ = p.signal(syscall.SIGCONT) },
	}
}

// waitState waits until the process is in state want (R, S, T, ...).
func waitState(pid int, want byte, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		st := procState(pid)
		if st == want || want == 'T' && st == 't' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d is in state %q, not %q, %v after the signal", pid, st, want, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// procState is the state letter of /proc/PID/stat (0 if unreadable). The
// command name may contain spaces and parentheses: the state follows the
// last ')'.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// shaper injects tc netem faults on the devices the data path crosses:
// the initiator's veth end of a namespace pair, or devices named by the
// caller (Config.NetemDevices: the rxe link's veths in the Soft-RoCE VM).
type shaper struct {
	prefix []string // how to run tc (in a namespace, or directly)
	devs   []string
	err    error // why netem cannot be used here (nil: it can)
}

// newShaper probes netem (a kernel module, sch_netem, some kernels lack),
// so that the report never claims a fault that was not injected.
func newShaper(prefix []string, devs ...string) *shaper {
	sh := &shaper{prefix: prefix, devs: devs}
	if sh.err = sh.netem("delay 1ms"); sh.err == nil {
		sh.err = sh.netem("")
	}
	return sh
}

func (sh *shaper) tc(args ...string) ([]byte, error) {
	cmd := append(append([]string(nil), sh.prefix...), append([]string{"tc"}, args...)...)
	out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %v: %s", strings.Join(cmd, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// netem installs spec ("delay 20ms loss 5%") on every device; "" removes it.
func (sh *shaper) netem(spec string) error {
	for _, dev := range sh.devs {
		args := []string{"qdisc", "del", "dev", dev, "root"}
		if spec != "" {
			args = append([]string{"qdisc", "replace", "dev", dev, "root", "netem"}, strings.Fields(spec)...)
		}
		if _, err := sh.tc(args...); err != nil {
			return err
		}
	}
	return nil
}

// installed reads the qdiscs back (tc qdisc show) and checks that each
// device has a netem qdisc with every parameter of spec.
func (sh *shaper) installed(spec string) error {
	for _, dev := range sh.devs {
		out, err := sh.tc("qdisc", "show", "dev", dev)
		if err != nil {
			return err
		}
		got := string(out)
		if !strings.Contains(got, "netem") {
			return fmt.Errorf("no netem qdisc on %s after installing %q: %s", dev, spec, strings.TrimSpace(got))
		}
		for _, word := range strings.Fields(spec) {
			if word != "delay" && word != "loss" && !strings.Contains(got, word) {
				return fmt.Errorf("netem on %s lacks %q of %q: %s", dev, word, spec, strings.TrimSpace(got))
			}
		}
	}
	return nil
}

// fault is netem spec on the shaped devices, confirmed installed.
func (sh *shaper) fault(spec string) fault {
	return fault{name: "netem " + spec, underFault: spec != "loss 100%",
		apply: func() error {
			if err := sh.netem(spec); err != nil {
				return err
			}
			return sh.installed(spec)
		},
		release: func() { _ = sh.netem("") },
	}
}

// reachedWithin asks f.reached until it says yes or d has passed: a
// refusal may come before the write's bytes reach the fault, while a write
// whose data goes around it never does (NOT RUN, not a pass).
func reachedWithin(f fault, n uint64, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		err := f.reachedBy(n)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// reachedBy asks f.reached when the fault has one.
func (f fault) reachedBy(n uint64) error {
	if f.reached == nil {
		return nil
	}
	return f.reached(n)
}
