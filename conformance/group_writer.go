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
	fill(se.dst.Bytes()[off-4096:off+n+4096], 0x2B)
	k, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Offset: off, Length: n, Writer: iep.Address})
	if err != nil {
		return fmt.Errorf("Grant bound to the initiator: %w", err)
	}
	defer se.tgt.g.Revoke(ctx, k) //nolint:errcheck
	if c, err := se.postWait(ctx, se.write(k, 0, 0, 4096)); err != nil || c.Status != sdk.Succeeded {
		return healthy("the bound writer's write", c, err)
	}
	other, err := s.open(ctx, "initiator-2", s.cfg.InitiatorEnv)
	if err != nil {
		return err
	}
	defer other.close()
	mem, err := sdk.NewSharedMemory("conformance-src2", 64<<10)
	if err != nil {
		return err
	}
	defer mem.Close()
	fill(mem.Bytes(), 0xE1)
	srcID, err := other.t.RegisterMemory(ctx, mem.Desc())
	if err != nil {
		return fmt.Errorf("second initiator RegisterMemory: %w", err)
	}
	tep, err := se.tgt.t.LocalEndpoint(ctx)
	if err != nil {
		return err
	}
	if s.cfg.TargetAddr != "" {
		if _, port, perr := net.SplitHostPort(tep.Address); perr == nil {
			tep.Address = net.JoinHostPort(s.cfg.TargetAddr, port)
		}
	}
	peer, err := other.t.Connect(ctx, tep)
	if err != nil {
		return fmt.Errorf("second initiator Connect: %w", err)
	}
	var next sdk.BatchID = 1
	foreign := func(key sdk.Key, at uint64) (sdk.Completion, error) {
		id := next
		next++
		b := sdk.Batch{ID: id, Peer: peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: srcID, RemoteKey: key, RemoteOffset: at, Length: 4096}}}
		if err := other.t.Post(ctx, b); err != nil {
			return sdk.Completion{}, err
		}
		deadline := time.After(s.cfg.CompletionTimeout)
		for {
			select {
			case c, ok := <-other.t.Completions():
				if !ok {
					return sdk.Completion{}, fmt.Errorf("second initiator's completion stream closed")
				}
				if c.Batch == id {
					return c, nil
				}
			case <-deadline:
				r.Promise = PromiseOneCompletion
				return sdk.Completion{}, fmt.Errorf("no completion for the second initiator's write")
			}
		}
	}
	c, err := foreign(k, 8192)
	if err != nil {
		return err
	}
	if c.Status == sdk.Succeeded {
		return fmt.Errorf("a write from another writer under a bound key reported Succeeded")
	}
	if c.Status == sdk.InDoubt {
		if _, err := other.t.Quiesce(ctx, peer, []sdk.BatchID{c.Batch}); err != nil {
			r.Notes = append(r.Notes, "second initiator Quiesce: "+err.Error())
		}
	}
	if ch := watch(se.dst.Bytes(), s.guard); ch != nil {
		return fmt.Errorf("target memory changed after the refused write: %v", ch)
	}
	if err := untouched(se.dst.Bytes()[off+8192:off+8192+4096], 0x2B); err != nil {
		return fmt.Errorf("another writer's bytes landed under a bound key: %w", err)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("other writer under a bound key: %v (%s)", c.Status, c.Detail))
	// The control arm: an unbound key lets the same write through.
	k2, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Offset: off + n, Length: 4096})
	if err != nil {
		return fmt.Errorf("unbound Grant: %w", err)
	}
	defer se.tgt.g.Revoke(ctx, k2) //nolint:errcheck
	if c, err := foreign(k2, 0); err != nil || c.Status != sdk.Succeeded || se.dst.Bytes()[off+n] != 0xE1 {
		return fmt.Errorf("control arm: another writer's write under an unbound key did not land (%+v, %v): the refusal above proves nothing", c, err)
	}
	return nil
}
