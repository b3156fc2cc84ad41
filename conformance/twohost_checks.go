package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/sdk"
)

// openInitiator starts the initiator plugin in the initiator namespace,
// registers its source, takes one key on the target host and connects.
func (th *twoHost) openInitiator(ctx context.Context, sum []byte, hello ctlReply) error {
	in := newIniSide(th.cfg.CompletionTimeout)
	th.se = in
	env := append(append([]string(nil), th.cfg.Env...), "KVFENCE_TCP_LISTEN="+nsIniAddr+":0")
	p, err := sdk.Open(th.cfg.Plugin, sdk.OpenOptions{Env: env, SHA256: sum, Logger: hclog.NewNullLogger(),
		StartTimeout: 30 * time.Second, Stderr: prefixed(th.cfg.Log, "initiator"),
		ExecVia: []string{"ip", "netns", "exec", th.net.ini}})
	if err != nil {
		return fmt.Errorf("open initiator: %w", err)
	}
	in.p, in.t = p, p.Transport()
	info, err := in.t.Info(ctx)
	if err != nil {
		return fmt.Errorf("initiator Info: %w", err)
	}
	if hello.Info != nil {
		mt := max(hello.Info.Capabilities.MaxTail, info.Capabilities.MaxTail)
		th.guard = max(min(2*mt, time.Minute), th.cfg.GuardFloor)
	}
	th.rep.GuardWindow = th.guard.String()
	th.rep.Initiator = th.net.iniHost()
	if in.src, err = sdk.NewSharedMemory("conformance-src", twoHostOff+twoHostWin+4096); err != nil {
		return err
	}
	pattern(in.src.Bytes(), 1)
	if in.srcID, err = in.t.RegisterMemory(ctx, in.src.Desc()); err != nil {
		return fmt.Errorf("initiator RegisterMemory: %w", err)
	}
	if in.peer, err = in.t.Connect(ctx, hello.Endpoint); err != nil {
		return fmt.Errorf("initiator Connect to %s: %w", hello.Endpoint.Address, err)
	}
	go in.collect()
	go in.drain()
	return nil
}

// iniHost names the initiator's host: the initiator namespace's interfaces.
func (n *netnsPair) iniHost() HostInfo {
	h := HostInfo{Netns: n.ini}
	h.Hostname, _ = os.Hostname()
	out, _ := nsCmd(n.ini, "ip", "-o", "-4", "addr", "show")
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 4 && f[1] != "lo" {
			run := func(args ...string) (string, error) { return nsCmd(n.ini, args...) }
			h.NICs = append(h.NICs, NICRef{Name: f[1], Driver: nicDriver(run, f[1]), Addrs: []string{f[3]}})
		}
	}
	return h
}

type twoHostCheckFn func(ctx context.Context, r *TwoHostCheck) error

// checks is the two-host check list: a healthy write, then the write
// judged under each kernel fault on the data link.
func (th *twoHost) checks() []struct {
	name, promise string
	fn            twoHostCheckFn
} {
	type c = struct {
		name, promise string
		fn            twoHostCheckFn
	}
	under := func(f fault, during func()) twoHostCheckFn {
		return func(ctx context.Context, r *TwoHostCheck) error { return th.honest(ctx, r, f, during) }
	}
	reset, abort := th.net.resetFault()
	out := []c{
		{"healthy-write", PromiseSucceeded, th.checkHealthy},
		{"link-slowed", PromiseSucceeded, under(th.net.slowFault(), nil)},
		{"link-dropped", PromiseFailed, under(th.net.dropFault(), nil)},
		{"link-reset", PromiseFailed, under(reset, func() { time.Sleep(50 * time.Millisecond); abort() })},
	}
	if rej, err := th.net.rejectFault(); err != nil {
		out = append(out, c{"link-rejected", PromiseFailed, func(context.Context, *TwoHostCheck) error { return err }})
	} else {
		out = append(out, c{"link-rejected", PromiseFailed, under(rej, nil)})
	}
	sh := th.net.shaper
	out = append(out, c{"netem-delay-loss", PromiseFailed, func(ctx context.Context, r *TwoHostCheck) error {
		if sh.err != nil {
			return errSkip("tc netem unavailable on this kernel: %v", sh.err)
		}
		return th.honest(ctx, r, sh.fault("delay 20ms loss 5%"), nil)
	}})
	return out
}

func (th *twoHost) run(ctx context.Context) {
	k, err := th.cc.call(ctlRequest{Op: "grant", Off: twoHostOff, N: twoHostWin, Byte: 0xA7})
	if err != nil {
		th.rep.Error = err.Error()
		return
	}
	th.key = sdk.Key(k.Key)
	th.rep.Passed = true
	skipped := false
	for _, c := range th.checks() {
		r := TwoHostCheck{Name: c.name, Promise: c.promise, Status: "pass"}
		err := c.fn(ctx, &r)
		var sk skipError
		switch {
		case errors.As(err, &sk):
			r.Status, r.Reason, skipped = "skip", sk.reason, true
		case err != nil:
			r.Status, r.Reason, th.rep.Passed = "fail", err.Error(), false
		}
		th.rep.Checks = append(th.rep.Checks, r)
		fmt.Fprintf(th.cfg.Log, "two-host %-18s %s %s\n", r.Name, r.Status, r.Reason)
	}
	_, _ = th.cc.call(ctlRequest{Op: "revoke", Key: uint64(th.key)})
	th.rep.Certified = th.rep.Passed && !skipped
}

// unchanged asks the target host whether its memory changed since snapshot
// id, watching the guard window after the snapshot.
func (th *twoHost) unchanged(id int) (string, error) { return th.unchangedFor(id, th.guard) }

// unchangedFor is unchanged watching d after the snapshot (the guard
// window, longer after a fault whose held-back bytes TCP resends later).
func (th *twoHost) unchangedFor(id int, d time.Duration) (string, error) {
	r, err := th.cc.call(ctlRequest{Op: "changed", Snapshot: id, WaitMs: d.Milliseconds()})
	return r.Change, err
}

func (th *twoHost) snap() (int, error) {
	r, err := th.cc.call(ctlRequest{Op: "snapshot"})
	return r.Snapshot, err
}

// holds asks whether the target holds the source pattern from src at off.
func (th *twoHost) holds(off, src, n uint64) (string, error) {
	r, err := th.cc.call(ctlRequest{Op: "compare", Off: off, Src: src, N: n})
	return r.Change, err
}

func (th *twoHost) checkHealthy(ctx context.Context, r *TwoHostCheck) error {
	se := th.se
	c, err := se.postWait(ctx, se.split(th.key, 333, 0, twoHostWin, 64<<10))
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("a write on a healthy link: %v (%s)", c.Status, c.Detail)
	}
	if bad, err := th.holds(twoHostOff, 333, twoHostWin); err != nil || bad != "" {
		return fmt.Errorf("reported Succeeded, but the target host does not hold the bytes: %s%v", bad, errOrNil(err))
	}
	id, err := th.snap()
	if err != nil {
		return err
	}
	if ch, err := th.unchanged(id); err != nil || ch != "" {
		return fmt.Errorf("target memory changed after Succeeded: %s%v", ch, errOrNil(err))
	}
	return nil
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return " " + err.Error()
}
