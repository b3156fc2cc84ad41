package conformance

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/sdk"
)

// The full suite on two hosts: the target host runs every target plugin
// process the suite asks for (a fresh one per session, as on one host),
// owns each one's destination memory, and answers for them — the plugin's
// own calls forwarded (their errors keep their class), signals delivered
// on this host, and memory read, filled and watched here. The certifying
// side's half is twohost_proc.go.

// hostProc is one target plugin process on this host and its memory.
type hostProc struct {
	p   *sdk.Plugin
	t   sdk.Transport
	g   sdk.Granter
	mem *sdk.SharedMemory
}

type hostOp func(th *targetHost, ctx context.Context, q ctlRequest) (ctlReply, error)

// hostOps are the full suite's requests, by name.
var hostOps = map[string]hostOp{
	"p.open":  (*targetHost).open,
	"p.close": (*targetHost).closeProc,
	"p.info": onProc(func(ctx context.Context, hp *hostProc, q ctlRequest, r *ctlReply) (err error) {
		r.Info = new(sdk.Info)
		*r.Info, err = hp.t.Info(ctx)
		return
	}),
	"p.register": onProc(opRegister),
	"p.deregister": onProc(func(ctx context.Context, hp *hostProc, q ctlRequest, _ *ctlReply) error {
		return hp.t.DeregisterMemory(ctx, sdk.RegionID(q.Region))
	}),
	"p.endpoint": onProc(func(ctx context.Context, hp *hostProc, q ctlRequest, r *ctlReply) (err error) {
		r.Endpoint, err = hp.t.LocalEndpoint(ctx)
		return
	}),
	"p.grant":  onProc(opGrant),
	"p.revoke": onProc(opRevoke),
	"p.signal": onProc(func(_ context.Context, hp *hostProc, q ctlRequest, _ *ctlReply) error {
		return syscall.Kill(hp.p.Pid(), syscall.Signal(q.Sig))
	}),
	"p.stop":  onProc(opStop),
	"p.kill":  onProc(opKill),
	"p.alive": onProc(opAlive),
	"p.memfd": onProc(func(_ context.Context, hp *hostProc, _ ctlRequest, r *ctlReply) error {
		r.Count = memfdMaps(hp.p.Pid())
		return nil
	}),
	"m.new": onProc(opNewMem),
	"m.read": onMem(func(_ *targetHost, m []byte, q ctlRequest, r *ctlReply) error {
		r.Data = append([]byte{}, m...)
		return nil
	}),
	"m.fill":    onMem(func(_ *targetHost, m []byte, q ctlRequest, _ *ctlReply) error { fill(m, q.Byte); return nil }),
	"m.pattern": onMem(func(_ *targetHost, m []byte, q ctlRequest, _ *ctlReply) error { patternAt(m, 0, q.Byte); return nil }),
	"m.watch":   onMem(opWatch),
	"m.until":   func(th *targetHost, _ context.Context, q ctlRequest) (ctlReply, error) { return th.watchOf(q, false) },
	"m.latest":  func(th *targetHost, _ context.Context, q ctlRequest) (ctlReply, error) { return th.watchOf(q, true) },
}

// open starts a plugin process as the target host started its first one.
func (th *targetHost) open(_ context.Context, q ctlRequest) (ctlReply, error) {
	var r ctlReply
	env := append(append([]string(nil), th.cfg.Env...), q.Env...)
	if th.cfg.DataAddr != "" {
		env = append(env, "KVFENCE_TCP_LISTEN="+net.JoinHostPort(th.cfg.DataAddr, "0"))
	}
	p, err := sdk.Open(th.cfg.Plugin, sdk.OpenOptions{Env: env, SHA256: th.sum, Logger: hclog.NewNullLogger(),
		StartTimeout: 30 * time.Second, Stderr: prefixed(orDiscard(th.cfg.Log), "target"), SyncPost: true})
	if err != nil {
		return r, fmt.Errorf("open target plugin: %w", err)
	}
	hp := &hostProc{p: p, t: p.Transport()}
	hp.g, r.Granter = hp.t.(sdk.Granter)
	r.Neg = p.NegotiatedVersion()
	th.mu.Lock()
	th.nextH++
	r.H = th.nextH
	th.procs[r.H] = hp
	th.mu.Unlock()
	return r, nil
}

func (hp *hostProc) close() {
	_ = syscall.Kill(hp.p.Pid(), syscall.SIGCONT) // a stopped process cannot die cleanly
	_ = hp.p.Close()
	if hp.mem != nil {
		_ = hp.mem.Close()
	}
}

func (th *targetHost) closeProc(_ context.Context, q ctlRequest) (ctlReply, error) {
	th.mu.Lock()
	hp := th.procs[q.H]
	delete(th.procs, q.H)
	th.mu.Unlock()
	if hp == nil {
		return ctlReply{}, fmt.Errorf("no target process %d", q.H)
	}
	hp.close()
	return ctlReply{}, nil
}

// closeAll stops every process the suite left (a certifying side that died).
func (th *targetHost) closeAll() {
	th.mu.Lock()
	defer th.mu.Unlock()
	for h, hp := range th.procs {
		hp.close()
		delete(th.procs, h)
	}
}

func (th *targetHost) proc(h int) (*hostProc, error) {
	th.mu.Lock()
	defer th.mu.Unlock()
	if hp := th.procs[h]; hp != nil {
		return hp, nil
	}
	return nil, fmt.Errorf("no target process %d", h)
}

func onProc(f func(ctx context.Context, hp *hostProc, q ctlRequest, r *ctlReply) error) hostOp {
	return func(th *targetHost, ctx context.Context, q ctlRequest) (ctlReply, error) {
		var r ctlReply
		hp, err := th.proc(q.H)
		if err != nil {
			return r, err
		}
		return r, f(ctx, hp, q, &r)
	}
}

// onMem runs f on [Off,+N) of process H's memory.
func onMem(f func(th *targetHost, m []byte, q ctlRequest, r *ctlReply) error) hostOp {
	return func(th *targetHost, _ context.Context, q ctlRequest) (ctlReply, error) {
		var r ctlReply
		hp, err := th.proc(q.H)
		if err != nil {
			return r, err
		}
		if hp.mem == nil {
			return r, fmt.Errorf("target process %d has no memory", q.H)
		}
		if size := uint64(len(hp.mem.Bytes())); q.Off > size || q.N > size-q.Off {
			return r, fmt.Errorf("[%d,+%d) is outside the %d-byte destination", q.Off, q.N, size)
		}
		return r, f(th, hp.mem.Bytes()[q.Off:q.Off+q.N], q, &r)
	}
}

func opRegister(ctx context.Context, hp *hostProc, q ctlRequest, r *ctlReply) error {
	if q.Desc == nil {
		return fmt.Errorf("register: no descriptor")
	}
	id, err := hp.t.RegisterMemory(ctx, *q.Desc)
	r.Region = uint64(id)
	return err
}

func opGrant(ctx context.Context, hp *hostProc, q ctlRequest, r *ctlReply) error {
	if hp.g == nil || q.Window == nil {
		return fmt.Errorf("grant: no Granter or no window")
	}
	k, err := hp.g.Grant(ctx, *q.Window)
	r.Key = uint64(k)
	return err
}

func opRevoke(ctx context.Context, hp *hostProc, q ctlRequest, r *ctlReply) error {
	if hp.g == nil {
		return fmt.Errorf("revoke: no Granter")
	}
	res, err := hp.g.Revoke(ctx, sdk.Key(q.Key))
	r.Revoked = &res
	return err
}

func opStop(_ context.Context, hp *hostProc, _ ctlRequest, _ *ctlReply) error {
	if err := syscall.Kill(hp.p.Pid(), syscall.SIGSTOP); err != nil {
		return err
	}
	return waitState(hp.p.Pid(), 'T', 5*time.Second)
}

func opKill(_ context.Context, hp *hostProc, q ctlRequest, _ *ctlReply) error {
	if err := syscall.Kill(hp.p.Pid(), syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-hp.p.Exited():
		return nil
	case <-time.After(time.Duration(q.WaitMs) * time.Millisecond):
		return fmt.Errorf("target not reaped %v after SIGKILL", time.Duration(q.WaitMs)*time.Millisecond)
	}
}

func opAlive(ctx context.Context, hp *hostProc, _ ctlRequest, _ *ctlReply) error {
	select {
	case <-hp.p.Exited():
		return fmt.Errorf("target plugin process exited")
	default:
	}
	if _, err := hp.t.Info(ctx); err != nil {
		return fmt.Errorf("target plugin does not answer: %w", err)
	}
	return nil
}

func opNewMem(_ context.Context, hp *hostProc, q ctlRequest, r *ctlReply) (err error) {
	if hp.mem != nil {
		return fmt.Errorf("the target process already has its memory")
	}
	if hp.mem, err = sdk.NewSharedMemory("conformance-dst", q.N); err != nil {
		return err
	}
	d := hp.mem.Desc()
	r.Desc = &d
	return nil
}

func opWatch(th *targetHost, m []byte, _ ctlRequest, r *ctlReply) error {
	th.mu.Lock()
	defer th.mu.Unlock()
	th.snaps = append(th.snaps, snapshot(m))
	r.Snapshot = len(th.snaps)
	return nil
}

// watchOf watches a snapshot for WaitMs after it was taken: the first
// change, or (last) the latest one seen.
func (th *targetHost) watchOf(q ctlRequest, last bool) (ctlReply, error) {
	var r ctlReply
	th.mu.Lock()
	if q.Snapshot < 1 || q.Snapshot > len(th.snaps) || th.snaps[q.Snapshot-1] == nil {
		th.mu.Unlock()
		return r, fmt.Errorf("no snapshot %d", q.Snapshot)
	}
	w := th.snaps[q.Snapshot-1]
	th.snaps[q.Snapshot-1] = nil
	th.mu.Unlock()
	d := time.Duration(q.WaitMs) * time.Millisecond
	if last {
		r.Changed = w.latest(d)
	} else {
		r.Changed = w.until(d)
	}
	return r, nil
}
