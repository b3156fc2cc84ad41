package conformance

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
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

// targetHost is the target side's state: one plugin process, one
// destination region, and the snapshots the certifying side asked for.
type targetHost struct {
	cfg   TargetConfig
	p     *sdk.Plugin
	t     sdk.Transport
	g     sdk.Granter
	dst   *sdk.SharedMemory
	dstID sdk.RegionID
	snaps []*watcher
	sum   string
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
	th := &targetHost{cfg: cfg, p: p, t: p.Transport(), sum: hex.EncodeToString(sum)}
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

func (th *targetHost) serve(ctx context.Context, cc *ctlConn) error {
	for {
		var q ctlRequest
		if err := cc.recv(&q); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		r, err := th.do(ctx, q)
		if err != nil {
			r.Err = err.Error()
		}
		if err := cc.send(r); err != nil {
			return err
		}
		if q.Op == "bye" {
			return nil
		}
	}
}

// within checks that [off,+n) lies in the destination region.
func (th *targetHost) within(off, n uint64) error {
	if off > th.cfg.Size || n > th.cfg.Size-off {
		return fmt.Errorf("[%d,+%d) is outside the %d-byte destination", off, n, th.cfg.Size)
	}
	return nil
}

func (th *targetHost) do(ctx context.Context, q ctlRequest) (ctlReply, error) {
	var r ctlReply
	if q.Op != "hello" && q.Op != "bye" && q.Op != "changed" && q.Op != "snapshot" && q.Op != "revoke" {
		if err := th.within(q.Off, q.N); err != nil {
			return r, err
		}
	}
	mem := th.dst.Bytes()
	switch q.Op {
	case "hello":
		ep, err := th.t.LocalEndpoint(ctx)
		if err != nil {
			return r, err
		}
		info, err := th.t.Info(ctx)
		if err != nil {
			return r, err
		}
		h := localHost(th.cfg.Netns)
		r.Endpoint, r.Host, r.Info, r.SHA256 = ep, &h, &info, th.sum
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
		for j := range want {
			i := int(q.Src) + j
			want[j] = byte(i*131+i>>9) ^ 1
		}
		if err := mismatch(mem[q.Off:q.Off+q.N], want); err != nil {
			r.Change = err.Error()
		}
	case "snapshot":
		th.snaps = append(th.snaps, snapshot(mem))
		r.Snapshot = len(th.snaps)
	case "changed": // the first change since snapshot, watching WaitMs after it
		if q.Snapshot < 1 || q.Snapshot > len(th.snaps) {
			return r, fmt.Errorf("no snapshot %d", q.Snapshot)
		}
		if ch := th.snaps[q.Snapshot-1].until(time.Duration(q.WaitMs) * time.Millisecond); ch != nil {
			r.Change = ch.String()
		}
		th.snaps[q.Snapshot-1] = nil
	case "bye":
	default:
		return r, fmt.Errorf("unknown op %q", q.Op)
	}
	return r, nil
}
