// Package nocanceltest runs the fault scenarios that the vendor plugins'
// tests share: two real plugin processes (initiator and target, loaded with
// sdk.Open) over a fake vendor library that really moves bytes, a real
// fault (SIGSTOP/SIGCONT of the target), and a judge that watches target
// memory after each promise.
//
// Layer 2 of the three plugin suites (contract → fault judge →
// certification; docs/writing-a-plugin.md §6): the fault judge for plugins
// built on kit/nocancel. Layer 1 (sdk/sdktest) checks the contract on a
// healthy pair; this layer injects the faults a vendor library is known
// for (a stopped target: SIGSTOP/SIGCONT) over the fake library and judges
// each promise against target memory after the target resumes (a
// FailedDefinite whose bytes land then is caught). It builds on
// both neighbours: plugins are built with sdktest.BuildPlugin, and
// CertifyOverFake runs layer 3 (package conformance, profile grant-only)
// over the fake library, where the link faults cannot reach the fakes'
// data, so the run is partial and certifies nothing; certification proper
// is layer 3 on a real link.
//
// It owns the scenarios and the judge. It must never reach into a plugin
// (only the sdk contract and signals), and never weaken a judgement to let
// a plugin pass.
package nocanceltest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/sdk"
)

// The promises judged here, in the conformance suite's words.
const (
	PromiseSucceeded = "Succeeded means every byte landed and nothing more moves"
	PromiseFailed    = "FailedDefinite means nothing more of the batch moves"
	PromiseQuiesce   = "Quiesce returns only when none of the batches can move a byte"
	PromiseOne       = "exactly one terminal completion per accepted batch"
)

// Pair is an initiator and a target plugin process, a source region at the
// initiator and a granted target window.
type Pair struct {
	Ini, Tgt *sdk.Plugin
	Src, Dst *sdk.SharedMemory
	SrcID    sdk.RegionID
	DstID    sdk.RegionID
	Key      sdk.Key
	Peer     sdk.PeerID
	next     atomic.Uint64 // the last batch id handed out (ids start at 101)
}

// Size of each side's memory.
const Size = 16 << 20

// NewPair starts both processes (env for both, iniEnv/tgtEnv for one).
func NewPair(t testing.TB, bin string, env, iniEnv, tgtEnv []string, log io.Writer) *Pair {
	t.Helper()
	ctx := context.Background()
	open := func(extra []string) *sdk.Plugin {
		p, err := sdk.Open(bin, sdk.OpenOptions{Env: append(append([]string(nil), env...), extra...), Logger: hclog.NewNullLogger(), Stderr: log, StartTimeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("open %s: %v", bin, err)
		}
		t.Cleanup(func() { _ = syscall.Kill(p.Pid(), syscall.SIGCONT); _ = p.Close() })
		return p
	}
	p := &Pair{Tgt: open(tgtEnv), Ini: open(iniEnv)}
	var err error
	for _, m := range []**sdk.SharedMemory{&p.Src, &p.Dst} {
		if *m, err = sdk.NewSharedMemory("nocanceltest", Size); err != nil {
			t.Fatal(err)
		}
		mm := *m
		t.Cleanup(func() { _ = mm.Close() })
	}
	for i := range p.Src.Bytes() {
		p.Src.Bytes()[i] = byte(i*131 + i>>9)
	}
	if p.SrcID, err = p.Ini.Transport().RegisterMemory(ctx, p.Src.Desc()); err != nil {
		t.Fatal(err)
	}
	if p.DstID, err = p.Tgt.Transport().RegisterMemory(ctx, p.Dst.Desc()); err != nil {
		t.Fatal(err)
	}
	g, ok := p.Tgt.Transport().(sdk.Granter)
	if !ok {
		t.Fatal("the target transport offers no Grant")
	}
	if p.Key, err = g.Grant(ctx, sdk.Window{Region: p.DstID, Length: Size}); err != nil {
		t.Fatal(err)
	}
	ep, err := p.Tgt.Transport().LocalEndpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Peer, err = p.Ini.Transport().Connect(ctx, ep); err != nil {
		t.Fatal(err)
	}
	return p
}

// Write is one batch writing src[off:off+n] to dst[off:off+n] in ops of
// at most op bytes. Safe to call from several goroutines.
func (p *Pair) Write(off, n, op uint64) sdk.Batch {
	b := sdk.Batch{ID: sdk.BatchID(p.next.Add(1)), Peer: p.Peer}
	for o := off; o < off+n; o += op {
		l := min(op, off+n-o)
		b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: p.SrcID, LocalOffset: o, RemoteKey: p.Key, RemoteOffset: o, Length: l})
	}
	return b
}

// Wait returns the batch's completion, checking that no other arrives for
// another batch meanwhile (one batch at a time in these scenarios).
func (p *Pair) Wait(id sdk.BatchID, within time.Duration) (sdk.Completion, error) {
	select {
	case c, ok := <-p.Ini.Transport().Completions():
		if !ok {
			return c, fmt.Errorf("completion stream closed")
		}
		if c.Batch != id {
			return c, fmt.Errorf("completion for batch %d while waiting for %d", c.Batch, id)
		}
		return c, nil
	case <-time.After(within):
		return sdk.Completion{}, fmt.Errorf("no completion for batch %d within %v", id, within)
	}
}

// NoMore fails if another completion arrives within d.
func (p *Pair) NoMore(d time.Duration) error {
	select {
	case c := <-p.Ini.Transport().Completions():
		return fmt.Errorf("unexpected completion %+v", c)
	case <-time.After(d):
		return nil
	}
}

// Landed reports whether dst holds src over [off, off+n).
func (p *Pair) Landed(off, n uint64) bool {
	return bytes.Equal(p.Dst.Bytes()[off:off+n], p.Src.Bytes()[off:off+n])
}

// Snapshot copies dst[off:off+n]; ChangedSince watches it for d against
// the copy. Take the snapshot before lifting a fault, or bytes that land in
// between go unseen.
func (p *Pair) Snapshot(off, n uint64) []byte {
	return append([]byte(nil), p.Dst.Bytes()[off:off+n]...)
}

func (p *Pair) ChangedSince(before []byte, off, n uint64, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if !bytes.Equal(before, p.Dst.Bytes()[off:off+n]) {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// Stop sends the target SIGSTOP and waits (up to 2 s) until the kernel
// shows every one of its threads stopped, so that a write posted next
// cannot race the stop: against the real NIXL one such write in three
// completed Succeeded before the target had stopped. Cont resumes it.
func (p *Pair) Stop() {
	pid := p.Tgt.Pid()
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	for end := time.Now().Add(2 * time.Second); !allThreadsStopped(pid) && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

func (p *Pair) Cont() { _ = syscall.Kill(p.Tgt.Pid(), syscall.SIGCONT) }
