package conformance

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// remoteProc is a target plugin process on the target host, as the
// certifying side holds it: every call goes over the control channel to
// `kvfence conformance target`, which makes it there (twohost_hostops.go).
type remoteProc struct {
	cc   *ctlConn
	h    int
	errs *stickyErr // the suite's: a failed memory operation fails the check
}

func (rp *remoteProc) call(q ctlRequest) (ctlReply, error) {
	q.H = rp.h
	return rp.cc.call(q)
}

// openRemote opens a target plugin process on the target host.
func (s *suite) openRemote(ctx context.Context, env []string) (*proc, error) {
	env = append(append([]string(nil), s.cfg.Env...), env...)
	if s.cfg.Device != "" {
		env = append(env, "KVFENCE_DEVICE="+s.cfg.Device)
	}
	r, err := s.remote.call(ctlRequest{Op: "p.open", Env: env})
	if err != nil {
		return nil, fmt.Errorf("open target: %w", err)
	}
	rp := &remoteProc{cc: s.remote, h: r.H, errs: &s.memErr}
	rt := remoteTransport{rp}
	pr := &proc{role: "target", t: rt, remote: rp, neg: r.Neg}
	if r.Granter {
		pr.g = rt
	}
	if pr.info, err = rt.Info(ctx); err != nil {
		pr.close()
		return nil, fmt.Errorf("target Info: %w", err)
	}
	return pr, nil
}

func (rp *remoteProc) signal(sig syscall.Signal) error {
	_, err := rp.call(ctlRequest{Op: "p.signal", Sig: int(sig)})
	return err
}

func (rp *remoteProc) stop() error {
	_, err := rp.call(ctlRequest{Op: "p.stop"})
	return err
}

func (rp *remoteProc) kill(timeout time.Duration) error {
	_, err := rp.call(ctlRequest{Op: "p.kill", WaitMs: timeout.Milliseconds()})
	return err
}

func (rp *remoteProc) alive(context.Context) error {
	_, err := rp.call(ctlRequest{Op: "p.alive"})
	return err
}

// memfdMaps is -1 when the target host cannot say, and the failure then
// fails the check (as a failed memory operation does).
func (rp *remoteProc) memfdMaps() int {
	r, err := rp.call(ctlRequest{Op: "p.memfd"})
	if err != nil {
		rp.errs.set(err)
		return -1
	}
	return r.Count
}

func (rp *remoteProc) close() { _, _ = rp.call(ctlRequest{Op: "p.close"}) }

// memory makes the process's destination memory on the target host.
func (rp *remoteProc) memory(size uint64) (targetMem, error) {
	r, err := rp.call(ctlRequest{Op: "m.new", N: size})
	if err != nil {
		return nil, err
	}
	if r.Desc == nil {
		return nil, fmt.Errorf("target host: no memory descriptor")
	}
	return &remoteMem{rp: rp, desc: *r.Desc, err: rp.errs}, nil
}

// remoteTransport is the target plugin's sdk.Transport and sdk.Granter,
// forwarded. The suite only registers, grants, revokes and asks the target
// for its endpoint; a target never posts, so the initiator's half is not
// forwarded.
type remoteTransport struct{ rp *remoteProc }

var errNotForwarded = errdefs.Errorf(errdefs.Unimplemented, "the target host forwards only the target's half of the contract")

func (t remoteTransport) Info(context.Context) (sdk.Info, error) {
	r, err := t.rp.call(ctlRequest{Op: "p.info"})
	if err != nil || r.Info == nil {
		return sdk.Info{}, orErr(err, "no info")
	}
	return *r.Info, nil
}

func (t remoteTransport) RegisterMemory(_ context.Context, d sdk.MemoryDesc) (sdk.RegionID, error) {
	r, err := t.rp.call(ctlRequest{Op: "p.register", Desc: &d})
	return sdk.RegionID(r.Region), err
}

func (t remoteTransport) DeregisterMemory(_ context.Context, id sdk.RegionID) error {
	_, err := t.rp.call(ctlRequest{Op: "p.deregister", Region: uint64(id)})
	return err
}

func (t remoteTransport) LocalEndpoint(context.Context) (sdk.Endpoint, error) {
	r, err := t.rp.call(ctlRequest{Op: "p.endpoint"})
	return r.Endpoint, err
}

func (t remoteTransport) Grant(_ context.Context, w sdk.Window) (sdk.Key, error) {
	r, err := t.rp.call(ctlRequest{Op: "p.grant", Window: &w})
	return sdk.Key(r.Key), err
}

func (t remoteTransport) Revoke(_ context.Context, k sdk.Key) (sdk.RevokeResult, error) {
	r, err := t.rp.call(ctlRequest{Op: "p.revoke", Key: uint64(k)})
	if r.Revoked == nil {
		return sdk.RevokeResult{}, err
	}
	return *r.Revoked, err
}

func (remoteTransport) Connect(context.Context, sdk.Endpoint) (sdk.PeerID, error) {
	return "", errNotForwarded
}
func (remoteTransport) Disconnect(context.Context, sdk.PeerID) error { return errNotForwarded }
func (remoteTransport) Post(context.Context, sdk.Batch) error        { return errNotForwarded }
func (remoteTransport) Completions() <-chan sdk.Completion           { return nil }
func (remoteTransport) Quiesce(context.Context, sdk.PeerID, []sdk.BatchID) (sdk.QuiesceResult, error) {
	return sdk.QuiesceResult{}, errNotForwarded
}
func (remoteTransport) Close() error { return nil }

func orErr(err error, what string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("target host: %s", what)
}

// remoteMem is destination memory on the target host.
type remoteMem struct {
	rp   *remoteProc
	desc sdk.MemoryDesc
	err  *stickyErr
}

func (m *remoteMem) Desc() sdk.MemoryDesc { return m.desc }
func (m *remoteMem) Close() error         { return nil } // freed with its process

func (m *remoteMem) op(q ctlRequest) ctlReply {
	r, err := m.rp.call(q)
	m.err.set(err)
	return r
}

// read is a copy of [off,+n) as the target host reads it; zeros when the
// channel failed (failed says so, and the check fails for it).
func (m *remoteMem) read(off, n uint64) []byte {
	r := m.op(ctlRequest{Op: "m.read", Off: off, N: n})
	if uint64(len(r.Data)) != n {
		m.err.set(fmt.Errorf("target host read [%d,+%d): %d bytes", off, n, len(r.Data)))
		return make([]byte, n)
	}
	return r.Data
}

func (m *remoteMem) fill(off, n uint64, v byte) {
	m.op(ctlRequest{Op: "m.fill", Off: off, N: n, Byte: v})
}
func (m *remoteMem) pattern(off, n uint64, seed byte) {
	m.op(ctlRequest{Op: "m.pattern", Off: off, N: n, Byte: seed})
}

func (m *remoteMem) watch(off, n uint64) memWatch {
	r := m.op(ctlRequest{Op: "m.watch", Off: off, N: n})
	return remoteWatch{m: m, id: r.Snapshot}
}

// remoteWatch is a snapshot the target host took and watches.
type remoteWatch struct {
	m  *remoteMem
	id int
}

func (w remoteWatch) until(d time.Duration) *change {
	return w.m.op(ctlRequest{Op: "m.until", Snapshot: w.id, WaitMs: d.Milliseconds()}).Changed
}

func (w remoteWatch) latest(d time.Duration) *change {
	return w.m.op(ctlRequest{Op: "m.latest", Snapshot: w.id, WaitMs: d.Milliseconds()}).Changed
}

// dialHosts connects to a target host already running on another machine
// (Config.RemoteTarget): no namespaces, no management link of ours; the
// link between the hosts is whatever the network is.
func (s *suite) dialHosts() error {
	c, err := net.DialTimeout("tcp", s.cfg.RemoteTarget, 10*time.Second)
	if err != nil {
		return err
	}
	hp := &hostPair{control: "HMAC-SHA256-authenticated channel to " + s.cfg.RemoteTarget}
	if hp.cc, err = ctlClient(c, s.cfg.RemoteSecret); err != nil {
		_ = c.Close()
		return err
	}
	s.hosts, s.remote = hp, hp.cc
	return hp.greet(s.report.Plugin.SHA256)
}

// startHosts starts the target host for the full suite: the namespaces, the
// management link and `kvfence conformance target` in the target's
// namespace. Its data link is the suite's link (netem on it where the
// kernel has sch_netem).
func (s *suite) startHosts() error {
	// The target host opens a first plugin process at start: it needs the
	// plugin's settings too (a library path, say), not only the ones the
	// suite's own opens carry.
	env := append(append([]string(nil), s.cfg.Env...), s.cfg.TargetEnv...)
	hp, err := startHosts(hostsConfig{plugin: s.cfg.Plugin, sha256: s.report.Plugin.SHA256, env: env,
		targetCommand: s.cfg.TargetCommand, log: s.cfg.Log})
	if hp != nil {
		s.hosts, s.net, s.shaper, s.remote = hp, hp.net, hp.net.shaper, hp.cc
	}
	return err
}
