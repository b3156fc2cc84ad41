package conformance

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// TargetConfig is the target host of a two-host run: `kvfence conformance
// target` runs the target plugin process on this host, owns its destination
// memory, and answers the certifying host over the authenticated control
// channel (see twohost_wire.go).
type TargetConfig struct {
	Plugin   string
	Env      []string
	Listen   string // control address (host:port; port 0 picks one)
	DataAddr string // the address the plugin listens on for data (KVFENCE_TCP_LISTEN host); "" leaves its default
	Secret   []byte
	Size     uint64 // destination memory, bytes
	Netns    string // how the certificate names this host's namespace, if any
	Log      io.Writer
	// Ready, when set, is told the control address once it listens.
	Ready func(addr string)
}

// targetHost is the target side's state: the plugin process it started
// with (handle 0, which the link-fault checks use), the ones the full suite
// asked for since, their destination memory and the snapshots of it the
// certifying side is watching.
type targetHost struct {
	cfg   TargetConfig
	p     *sdk.Plugin
	t     sdk.Transport
	g     sdk.Granter
	dst   *sdk.SharedMemory
	dstID sdk.RegionID
	sum   []byte
	hexs  string

	mu    sync.Mutex
	snaps []*watcher
	procs map[int]*hostProc
	nextH int
}

// ServeTarget serves one certifying client, then stops its plugin. It
// returns when the client hangs up or ctx ends.
func ServeTarget(ctx context.Context, cfg TargetConfig) error {
	if len(cfg.Secret) < 16 {
		return fmt.Errorf("target: the shared secret must be at least 16 bytes")
	}
	sum, err := sdk.FileSHA256(cfg.Plugin)
	if err != nil {
		return err
	}
	env := append([]string(nil), cfg.Env...)
	if cfg.DataAddr != "" {
		env = append(env, "KVFENCE_TCP_LISTEN="+net.JoinHostPort(cfg.DataAddr, "0"))
	}
	p, err := sdk.Open(cfg.Plugin, sdk.OpenOptions{Env: env, SHA256: sum, Logger: hclog.NewNullLogger(),
		StartTimeout: 30 * time.Second, Stderr: prefixed(orDiscard(cfg.Log), "target")})
	if err != nil {
		return fmt.Errorf("target: open plugin: %w", err)
	}
	defer p.Close()
	th := &targetHost{cfg: cfg, p: p, t: p.Transport(), sum: sum, hexs: hex.EncodeToString(sum), procs: map[int]*hostProc{}}
	defer th.closeAll()
	var ok bool
	if th.g, ok = th.t.(sdk.Granter); !ok {
		return fmt.Errorf("target: the plugin does not declare Grant/Revoke, which the two-host checks need")
	}
	if th.dst, err = sdk.NewSharedMemory("conformance-dst", cfg.Size); err != nil {
		return err
	}
	defer th.dst.Close()
	if th.dstID, err = th.t.RegisterMemory(ctx, th.dst.Desc()); err != nil {
		return fmt.Errorf("target RegisterMemory: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	go func() { <-ctx.Done(); _ = ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			return ctx.Err()
		}
		cc, err := ctlServer(c, cfg.Secret)
		if err != nil {
			// A stranger (or a wrong secret) is refused; the target keeps
			// waiting for its certifying host.
			fmt.Fprintf(orDiscard(cfg.Log), "target: %s: %v\n", c.RemoteAddr(), err)
			_ = c.Close()
			continue
		}
		err = th.serve(ctx, cc)
		_ = c.Close()
		return err
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// serve answers the client's requests, each in its own goroutine: a
// watch that lasts the guard window must not hold up a read of memory that
// the suite makes the moment a completion arrives.
func (th *targetHost) serve(ctx context.Context, cc *ctlConn) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		var q ctlRequest
		if err := cc.recv(&q); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if q.Op == "bye" {
			wg.Wait()
			return th.reply(cc, q, ctlReply{}, nil)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := th.do(ctx, q)
			_ = th.reply(cc, q, r, err)
		}()
	}
}

func (th *targetHost) reply(cc *ctlConn, q ctlRequest, r ctlReply, err error) error {
	r.ID = q.ID
	if err != nil {
		r.Err = err.Error()
		if c := errdefs.ClassOf(err); c != errdefs.Unknown {
			r.Class = c.String()
		}
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.send(r)
}

// within checks that [off,+n) lies in the destination region.
func (th *targetHost) within(off, n uint64) error {
	if off > th.cfg.Size || n > th.cfg.Size-off {
		return fmt.Errorf("[%d,+%d) is outside the %d-byte destination", off, n, th.cfg.Size)
	}
	return nil
}

// do answers one request: the full suite's ops by table, the link-fault
// checks' ops (on handle 0's memory) below.
func (th *targetHost) do(ctx context.Context, q ctlRequest) (ctlReply, error) {
	if op, ok := hostOps[q.Op]; ok {
		return op(th, ctx, q)
	}
	var r ctlReply
	if q.Op == "hello" {
		return th.hello(ctx)
	}
	if q.Op == "changed" {
		return th.changed(q)
	}
	if q.Op != "snapshot" && q.Op != "revoke" {
		if err := th.within(q.Off, q.N); err != nil {
			return r, err
		}
	}
	mem := th.dst.Bytes()
	switch q.Op {
	case "grant":
		fill(mem[q.Off:q.Off+q.N], q.Byte)
		k, err := th.g.Grant(ctx, sdk.Window{Region: th.dstID, Offset: q.Off, Length: q.N})
		r.Key = uint64(k)
		return r, err
	case "revoke":
		_, err := th.g.Revoke(ctx, sdk.Key(q.Key))
		return r, err
	case "fill":
		fill(mem[q.Off:q.Off+q.N], q.Byte)
	case "compare": // does [Off,+N) hold the initiator's source pattern from Src?
		want := make([]byte, q.N)
		patternAt(want, q.Src, 1)
		if err := mismatch(mem[q.Off:q.Off+q.N], want); err != nil {
			r.Change = err.Error()
		}
	case "snapshot":
		th.mu.Lock()
		th.snaps = append(th.snaps, snapshot(mem))
		r.Snapshot = len(th.snaps)
		th.mu.Unlock()
	default:
		return r, fmt.Errorf("unknown op %q", q.Op)
	}
	return r, nil
}

func (th *targetHost) hello(ctx context.Context) (ctlReply, error) {
	var r ctlReply
	ep, err := th.t.LocalEndpoint(ctx)
	if err != nil {
		return r, err
	}
	info, err := th.t.Info(ctx)
	if err != nil {
		return r, err
	}
	h := localHost(th.cfg.Netns)
	r.Endpoint, r.Host, r.Info, r.SHA256 = ep, &h, &info, th.hexs
	return r, nil
}

// changed is the first change since snapshot, watching WaitMs after it,
// in the words the link-fault checks read.
func (th *targetHost) changed(q ctlRequest) (ctlReply, error) {
	r, err := th.watchOf(q, false)
	if r.Changed != nil {
		r.Change, r.Changed = r.Changed.String(), nil
	}
	return r, err
}
