package conformance

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// checkWriterBoundKey: with Capabilities.WriterBound, a key granted to the
// initiator (Window.Writer = its LocalEndpoint address) is refused to a
// second initiator that holds the same key, and that writer's bytes land
// nowhere; the bound initiator's own write lands. The same foreign write
// through an unbound key must land, or the check could not tell.
func checkWriterBoundKey(ctx context.Context, s *suite, r *Result) error {
	if !s.info.Capabilities.WriterBound {
		return errNotApplicable("the plugin does not declare WriterBound")
	}
	se := s.main
	iep, err := se.ini.t.LocalEndpoint(ctx)
	if err != nil {
		return fmt.Errorf("initiator LocalEndpoint: %w", err)
	}
	if _, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Length: 4096, Writer: "127.0.0.1:1"}); !errdefs.Is(err, errdefs.FailedPrecondition) {
		r.Promise = PromiseErrorClass
		return fmt.Errorf("Grant to a writer that is not connected: %v, want FailedPrecondition", err)
	}
	// A refused write in an earlier check may have ended the initiator's
	// connection (verbs: its responder QP is in ERROR): a write through an
	// unbound key makes sure the initiator is connected before the Grant.
	const off, n = 4096, 64 << 10
	kw, err := se.grant(ctx, off+n+8192, 4096, 0x2B)
	if err != nil {
		return err
	}
	err = se.warm(ctx, kw)
	_, _ = se.tgt.g.Revoke(ctx, kw)
	if err != nil {
		return err
	}
	se.fillDst(off-4096, off+n+4096, 0x2B)
	k, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Offset: off, Length: n, Writer: iep.Address})
	if err != nil {
		return fmt.Errorf("Grant bound to the initiator: %w", err)
	}
	defer se.tgt.g.Revoke(ctx, k) //nolint:errcheck
	if c, err := se.postWait(ctx, se.write(k, 0, 0, 4096)); err != nil || c.Status != sdk.Succeeded {
		return healthy("the bound writer's write", c, err)
	}
	fw, err := s.newForeignWriter(ctx, se)
	if err != nil {
		return err
	}
	defer fw.close()
	if err := fw.refusedUnder(ctx, r, k, off+8192); err != nil {
		return err
	}
	// The control arm: an unbound key lets the same write through.
	k2, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Offset: off + n, Length: 4096})
	if err != nil {
		return fmt.Errorf("unbound Grant: %w", err)
	}
	defer se.tgt.g.Revoke(ctx, k2) //nolint:errcheck
	if c, err := fw.write(ctx, k2, 0); err != nil || c.Status != sdk.Succeeded || se.dstAt(off+n, off+n+1)[0] != 0xE1 {
		return fmt.Errorf("control arm: another writer's write under an unbound key did not land (%+v, %v): the refusal above proves nothing", c, err)
	}
	return nil
}

// foreignWriter is a second initiator, connected to the session's target,
// whose 4096-byte source holds 0xE1.
type foreignWriter struct {
	se    *session
	p     *proc
	mem   *sdk.SharedMemory
	srcID sdk.RegionID
	peer  sdk.PeerID
	next  sdk.BatchID
}

func (s *suite) newForeignWriter(ctx context.Context, se *session) (fw *foreignWriter, err error) {
	fw = &foreignWriter{se: se, next: 1}
	defer func() {
		if err != nil {
			fw.close()
		}
	}()
	if fw.p, err = s.open(ctx, "initiator-2", s.cfg.InitiatorEnv); err != nil {
		return fw, err
	}
	if fw.mem, err = sdk.NewSharedMemory("conformance-src2", 64<<10); err != nil {
		return fw, err
	}
	fill(fw.mem.Bytes(), 0xE1)
	if fw.srcID, err = fw.p.t.RegisterMemory(ctx, fw.mem.Desc()); err != nil {
		return fw, fmt.Errorf("second initiator RegisterMemory: %w", err)
	}
	tep, err := se.tgt.t.LocalEndpoint(ctx)
	if err != nil {
		return fw, err
	}
	if s.cfg.TargetAddr != "" {
		if _, port, perr := net.SplitHostPort(tep.Address); perr == nil {
			tep.Address = net.JoinHostPort(s.cfg.TargetAddr, port)
		}
	}
	if fw.peer, err = fw.p.t.Connect(ctx, tep); err != nil {
		return fw, fmt.Errorf("second initiator Connect: %w", err)
	}
	return fw, nil
}

func (fw *foreignWriter) close() {
	if fw.p != nil {
		fw.p.close()
	}
	if fw.mem != nil {
		_ = fw.mem.Close()
	}
}

// write posts one 4096-byte write under key at offset at and waits for its
// completion.
func (fw *foreignWriter) write(ctx context.Context, key sdk.Key, at uint64) (sdk.Completion, error) {
	id := fw.next
	fw.next++
	b := sdk.Batch{ID: id, Peer: fw.peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: fw.srcID, RemoteKey: key, RemoteOffset: at, Length: 4096}}}
	if err := fw.p.t.Post(ctx, b); err != nil {
		return sdk.Completion{}, err
	}
	deadline := time.After(fw.se.s.cfg.CompletionTimeout)
	for {
		select {
		case c, ok := <-fw.p.t.Completions():
			if !ok {
				return sdk.Completion{}, fmt.Errorf("second initiator's completion stream closed")
			}
			if c.Batch == id {
				return c, nil
			}
		case <-deadline:
			return sdk.Completion{}, broke(PromiseOneCompletion, fmt.Errorf("no completion for the second initiator's write"))
		}
	}
}

// refusedUnder: the foreign writer's write under k (bound to another
// writer) into the window's offset 8192 (target offset at) must not report
// Succeeded, and none of its bytes may land.
func (fw *foreignWriter) refusedUnder(ctx context.Context, r *Result, k sdk.Key, at uint64) error {
	se := fw.se
	c, err := fw.write(ctx, k, 8192)
	if err != nil {
		return err
	}
	if c.Status == sdk.Succeeded {
		return fmt.Errorf("a write from another writer under a bound key reported Succeeded")
	}
	if c.Status == sdk.InDoubt {
		if _, err := fw.p.t.Quiesce(ctx, fw.peer, []sdk.BatchID{c.Batch}); err != nil {
			r.Notes = append(r.Notes, "second initiator Quiesce: "+err.Error())
		}
	}
	if ch := se.dst.watch(0, se.size).until(se.s.guard); ch != nil {
		return fmt.Errorf("target memory changed after the refused write: %v", ch)
	}
	if err := untouched(se.dstAt(at, at+4096), 0x2B); err != nil {
		return fmt.Errorf("another writer's bytes landed under a bound key: %w", err)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("other writer under a bound key: %v (%s)", c.Status, c.Detail))
	return nil
}
