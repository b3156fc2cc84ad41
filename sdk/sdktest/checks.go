package sdktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// Check is one contract check. Run returns nil if the transport pair behaves
// as the contract demands.
type Check struct {
	Name string
	Run  func(ctx context.Context, e *Env) error
	// NeedsRevoke: the check's promise is revocation; it does not apply to
	// a transport that does not claim Capabilities.Revoke.
	NeedsRevoke bool
}

// Checks are the contract checks, in the order RunContract runs them.
func Checks() []Check {
	return []Check{
		{"info-declares-limits", checkInfo, false},
		{"write-lands-then-succeeds", checkWriteLands, false},
		{"unknown-key-is-not-success", checkUnknownKey, false},
		{"out-of-window-is-refused", checkOutOfWindow, false},
		{"key-bounds-confine-writes", checkKeyBounds, false},
		{"revoke-stops-writes", checkRevoke, true},
		{"bad-input-is-classified", checkBadInput, false},
		{"one-completion-per-batch", checkOneCompletion, false},
		{"quiesce-gives-evidence", checkQuiesce, false},
		{"batch-keys-answer-each-item", checkBatchKeys, true},
		{"refused-write-fails-alone", checkRefusalIsolated, true},
	}
}

// CheckNamed returns the check called name (it panics on a typo: tests only).
func CheckNamed(name string) Check {
	for _, c := range Checks() {
		if c.Name == name {
			return c
		}
	}
	panic("sdktest: no check " + name)
}

// RunContract runs every check against p as subtests, on one Env.
func RunContract(t *testing.T, p Pair) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), checkBudget)
	defer cancel()
	e, err := NewEnv(ctx, p)
	if err != nil {
		t.Fatalf("contract env: %v", err)
	}
	defer e.Close()
	runChecks(t, e, Checks(), checkBudget)
}

// checkBudget bounds one check (several waits of Timeout each).
const checkBudget = 5 * Timeout

// runChecks runs checks as subtests, each with a budget of its own: a
// check that comes late is not failed for the time the earlier ones used
// (on a loaded machine they use much of it).
func runChecks(t *testing.T, e *Env, checks []Check, budget time.Duration) {
	t.Helper()
	for _, c := range checks {
		t.Run(c.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			if err := c.Run(ctx, e); errors.Is(err, ErrNotApplicable) {
				t.Skip(err)
			} else if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func checkInfo(ctx context.Context, e *Env) error {
	i := e.Info
	switch {
	case i.Name == "":
		return fmt.Errorf("Info: empty name")
	case i.ProtocolVersion != sdk.ProtocolVersion:
		return fmt.Errorf("Info: protocol version %d, want %d", i.ProtocolVersion, sdk.ProtocolVersion)
	case i.Capabilities.MaxBatch <= 0:
		return fmt.Errorf("Info: MaxBatch %d", i.Capabilities.MaxBatch)
	case i.Capabilities.MaxTail <= 0:
		return fmt.Errorf("Info: MaxTail %v: a transport with no tail does not exist", i.Capabilities.MaxTail)
	}
	if !i.Capabilities.Revoke {
		// Grant without Revoke: a receiver whose backend cannot stop a
		// peer's writes still hands out keys, and must say it cannot revoke.
		if _, err := e.Granter.Revoke(ctx, sdk.Key(0x0bad0bad0bad0bad)); !errdefs.Is(err, errdefs.Unimplemented) {
			return fmt.Errorf("Info: Revoke not declared, but Revoke answers %v (want unimplemented)", err)
		}
	}
	return nil
}

// grant exposes [off, off+n) of the destination, after filling it with fill.
func (e *Env) grant(ctx context.Context, off, n uint64, fill byte) (sdk.Key, error) {
	b := e.Dst.Bytes()[off : off+n]
	for i := range b {
		b[i] = fill
	}
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: off, Length: n})
	if err != nil {
		return 0, fmt.Errorf("Grant: %w", err)
	}
	return k, nil
}

func (e *Env) postWait(ctx context.Context, b sdk.Batch) (sdk.Completion, error) {
	if err := e.Sender.Post(ctx, b); err != nil {
		return sdk.Completion{}, fmt.Errorf("Post(%d): %w", b.ID, err)
	}
	return e.Wait(b.ID)
}

// verdict posts b, which the sender must refuse, and returns the
// refusal: Post's error under the synchronous contract, or, when Post
// took it (the asynchronous Post hosts get by default), the class of the
// batch's FailedDefinite completion. Any other completion is an error of
// class unknown, so a check wanting an exact class fails on it.
func (e *Env) verdict(ctx context.Context, b sdk.Batch) error {
	before := e.Count(b.ID)
	if err := e.Sender.Post(ctx, b); err != nil {
		return err
	}
	c, err := e.waitNth(b.ID, before)
	switch {
	case err != nil:
		return err
	case c.Status == sdk.Succeeded:
		return nil // accepted
	case c.Status == sdk.FailedDefinite && c.Class != errdefs.Unknown:
		return errdefs.Errorf(c.Class, "refused as the batch's completion: %s", c.Detail)
	}
	return fmt.Errorf("batch %d completed %v (%s), not a classified refusal", b.ID, c.Status, c.Detail)
}

func untouched(mem []byte, fill byte) error {
	for i, v := range mem {
		if v != fill {
			return fmt.Errorf("byte %d of memory that must be untouched is %#x, want %#x", i, v, fill)
		}
	}
	return nil
}

func checkWriteLands(ctx context.Context, e *Env) error {
	const off, n = 0, 64 << 10
	k, err := e.grant(ctx, off, n, 0)
	if err != nil {
		return err
	}
	b := sdk.Batch{ID: e.NewBatchID(), Peer: e.Peer}
	for i := uint64(0); i < 16; i++ { // 16 pages of 4 KiB in one batch
		b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: e.SrcID, LocalOffset: 4096 * i,
			RemoteKey: k, RemoteOffset: 4096 * i, Length: 4096})
	}
	c, err := e.postWait(ctx, b)
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("batch: %v (%s), want Succeeded", c.Status, c.Detail)
	}
	if c.BytesLanded != n {
		return fmt.Errorf("BytesLanded %d, want %d", c.BytesLanded, n)
	}
	if !bytes.Equal(e.Dst.Bytes()[off:off+n], e.Src.Bytes()[:n]) {
		return fmt.Errorf("Succeeded, but the destination does not hold the bytes")
	}
	return nil
}

// checkUnknownKey: a write under a key nobody granted must not be reported
// Succeeded (a sender that trusts its socket would), and lands nowhere. A
// granted write goes first, so the unknown key meets an open connection
// (a receiver may refuse to open one for an unknown key, which would hide
// such a sender).
func checkUnknownKey(ctx context.Context, e *Env) error {
	const fill = 0xA5
	warm, err := e.grant(ctx, 256<<10, 4096, 0)
	if err != nil {
		return err
	}
	if c, err := e.postWait(ctx, e.Write(e.NewBatchID(), warm, 0, 0, 4096)); err != nil || c.Status != sdk.Succeeded {
		return fmt.Errorf("write under a granted key first: %+v, %v", c, err)
	}
	for i := range e.Dst.Bytes()[512<<10:] {
		e.Dst.Bytes()[512<<10+i] = fill
	}
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), sdk.Key(0x5eed5eed5eed5eed), 0, 0, 4096))
	if err != nil {
		if errdefs.ClassOf(err) == errdefs.NotFound || errdefs.ClassOf(err) == errdefs.InvalidArgument {
			return nil // refused at Post: also fine
		}
		return err
	}
	if c.Status == sdk.Succeeded {
		return fmt.Errorf("write under an unknown key reported Succeeded")
	}
	return untouched(e.Dst.Bytes()[512<<10:], fill)
}

func checkOutOfWindow(ctx context.Context, e *Env) error {
	const off, n, fill = 128 << 10, 4096, 0x3C
	guard := e.Dst.Bytes()[off : off+2*n]
	for i := range guard {
		guard[i] = fill
	}
	k, err := e.grant(ctx, off, n, fill)
	if err != nil {
		return err
	}
	// Starts inside the window, ends past it.
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 0, n/2, n))
	if err == nil && c.Status == sdk.Succeeded {
		return fmt.Errorf("write past the granted window reported Succeeded")
	}
	if err != nil && errdefs.ClassOf(err) != errdefs.InvalidArgument {
		return fmt.Errorf("out-of-window write refused with class %v, want invalid-argument", errdefs.ClassOf(err))
	}
	return untouched(guard, fill)
}

// checkRevoke: after Revoke returns, writes under the key land nowhere, are
// not Succeeded, and (when stats are reported) are counted as dropped.
func checkRevoke(ctx context.Context, e *Env) error {
	const off, n = 256 << 10, 8192
	k, err := e.grant(ctx, off, n, 0)
	if err != nil {
		return err
	}
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 0, 0, n))
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("write before revoke: %v (%s)", c.Status, c.Detail)
	}
	before := dropped(ctx, e.Receiver)
	if _, err := e.Granter.Revoke(ctx, k); err != nil {
		return fmt.Errorf("Revoke: %w", err)
	}
	snapshot := append([]byte(nil), e.Dst.Bytes()[off:off+n]...)
	// A different source pattern, so a late application would show.
	c, err = e.postWait(ctx, e.Write(e.NewBatchID(), k, 4096, 0, n))
	if err != nil {
		return err
	}
	if c.Status == sdk.Succeeded {
		return fmt.Errorf("write after Revoke reported Succeeded")
	}
	if !bytes.Equal(snapshot, e.Dst.Bytes()[off:off+n]) {
		return fmt.Errorf("write after Revoke changed the revoked window")
	}
	if after := dropped(ctx, e.Receiver); before >= 0 && after <= before {
		return fmt.Errorf("write after Revoke was not counted as dropped (%d -> %d)", before, after)
	}
	if _, err := e.Granter.Revoke(ctx, k); err != nil {
		return fmt.Errorf("second Revoke must be a no-op: %w", err)
	}
	return nil
}

// dropped reads the receiver's dropped-writes counter, or -1 without stats.
func dropped(ctx context.Context, t sdk.Transport) int64 {
	sr, ok := t.(sdk.StatsReporter)
	if !ok {
		return -1
	}
	m, err := sr.Stats(ctx)
	if err != nil {
		return -1
	}
	for k, v := range m {
		if len(k) >= len("writes_dropped") && k[len(k)-len("writes_dropped"):] == "writes_dropped" {
			return int64(v)
		}
	}
	return -1
}

func checkBadInput(ctx context.Context, e *Env) error {
	k, err := e.grant(ctx, 384<<10, 4096, 0)
	if err != nil {
		return err
	}
	dup := e.NewBatchID()
	if _, err := e.postWait(ctx, e.Write(dup, k, 0, 0, 4096)); err != nil {
		return err
	}
	tooMany := sdk.Batch{ID: e.NewBatchID(), Peer: e.Peer}
	for i := 0; i <= e.Info.Capabilities.MaxBatch; i++ {
		tooMany.Ops = append(tooMany.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: e.SrcID, RemoteKey: k, Length: 1})
	}
	cases := []struct {
		name string
		want errdefs.Class
		call func() error
	}{
		{"zero length", errdefs.InvalidArgument, func() error { return e.verdict(ctx, e.Write(e.NewBatchID(), k, 0, 0, 0)) }},
		{"empty batch", errdefs.InvalidArgument, func() error {
			return e.verdict(ctx, sdk.Batch{ID: e.NewBatchID(), Peer: e.Peer})
		}},
		{"duplicate batch id", errdefs.AlreadyExists, func() error { return e.verdict(ctx, e.Write(dup, k, 0, 0, 4096)) }},
		{"oversized batch", errdefs.InvalidArgument, func() error { return e.verdict(ctx, tooMany) }},
		{"unregistered local memory", errdefs.NotFound, func() error {
			b := e.Write(e.NewBatchID(), k, 0, 0, 4096)
			b.Ops[0].LocalRegion = e.SrcID + 1000
			return e.verdict(ctx, b)
		}},
		{"local out of bounds", errdefs.InvalidArgument, func() error {
			return e.verdict(ctx, e.Write(e.NewBatchID(), k, EnvSize-1, 0, 4096))
		}},
		{"unknown peer", errdefs.NotFound, func() error {
			b := e.Write(e.NewBatchID(), k, 0, 0, 4096)
			b.Peer = "no-such-peer"
			return e.verdict(ctx, b)
		}},
		{"grant on unregistered memory", errdefs.NotFound, func() error {
			_, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID + 1000, Length: 1})
			return err
		}},
		{"grant out of bounds", errdefs.InvalidArgument, func() error {
			_, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Offset: EnvSize, Length: 1})
			return err
		}},
		{"revoke unknown key", revokeRefusal(e.Info), func() error {
			_, err := e.Granter.Revoke(ctx, sdk.Key(0x0bad0bad0bad0bad))
			return err
		}},
		{"deregister unknown region", errdefs.NotFound, func() error { return e.Sender.DeregisterMemory(ctx, e.SrcID+1000) }},
		{"register bad memory", errdefs.NotFound, func() error {
			_, err := e.Sender.RegisterMemory(ctx, sdk.MemoryDesc{Kind: sdk.MemoryHostShared, Path: "/nonexistent/kvfence", Size: 4096})
			return err
		}},
	}
	for _, c := range cases {
		err := c.call()
		if err == nil {
			return fmt.Errorf("%s: accepted, want %v", c.name, c.want)
		}
		if got := errdefs.ClassOf(err); got != c.want {
			return fmt.Errorf("%s: class %v (%v), want %v", c.name, got, err, c.want)
		}
	}
	// Still up and still correct after all of that.
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 0, 0, 4096))
	if err != nil {
		return fmt.Errorf("after bad input: %w", err)
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("after bad input: %v (%s)", c.Status, c.Detail)
	}
	return nil
}

func checkOneCompletion(ctx context.Context, e *Env) error {
	k, err := e.grant(ctx, 448<<10, 64<<10, 0)
	if err != nil {
		return err
	}
	var ids []sdk.BatchID
	for i := uint64(0); i < 32; i++ {
		id := e.NewBatchID()
		if err := e.Sender.Post(ctx, e.Write(id, k, 0, (i%16)*4096, 4096)); err != nil {
			return err
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if _, err := e.Wait(id); err != nil {
			return err
		}
	}
	// A completion that is not the first shows up by the time a later
	// batch completes (completions of one transport are one stream).
	last := e.NewBatchID()
	if _, err := e.postWait(ctx, e.Write(last, k, 0, 0, 4096)); err != nil {
		return err
	}
	for _, id := range append(ids, last) {
		if n := e.Count(id); n != 1 {
			return fmt.Errorf("batch %d: %d completions, want exactly 1", id, n)
		}
	}
	return nil
}

func checkQuiesce(ctx context.Context, e *Env) error {
	k, err := e.grant(ctx, 640<<10, 64<<10, 0)
	if err != nil {
		return err
	}
	var ids []sdk.BatchID
	for i := uint64(0); i < 8; i++ {
		id := e.NewBatchID()
		if err := e.Sender.Post(ctx, e.Write(id, k, 0, i*4096, 4096)); err != nil {
			return err
		}
		ids = append(ids, id)
	}
	res, err := e.Sender.Quiesce(ctx, e.Peer, ids)
	if err != nil {
		return fmt.Errorf("Quiesce: %w", err)
	}
	if res.Evidence == "" {
		return fmt.Errorf("Quiesce: no evidence")
	}
	covered := map[sdk.BatchID]bool{}
	for _, id := range res.Batches {
		covered[id] = true
	}
	for _, id := range ids {
		if !covered[id] {
			return fmt.Errorf("Quiesce evidence does not cover batch %d", id)
		}
		c, err := e.Wait(id)
		if err != nil {
			return err
		}
		if c.Status == sdk.Succeeded && !bytes.Equal(e.Dst.Bytes()[640<<10+4096*(uint64(id-ids[0])):][:4096], e.Src.Bytes()[:4096]) {
			return fmt.Errorf("batch %d Succeeded but its bytes are not there", id)
		}
	}
	// The peer is usable again after a Quiesce.
	c, err := e.postWait(ctx, e.Write(e.NewBatchID(), k, 0, 0, 4096))
	if err != nil {
		return fmt.Errorf("after Quiesce: %w", err)
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("after Quiesce: %v (%s)", c.Status, c.Detail)
	}
	return nil
}

// revokeRefusal is the class of a Revoke of an unknown key: not found where
// the transport can revoke, unimplemented where it declares it cannot.
func revokeRefusal(i sdk.Info) errdefs.Class {
	if i.Capabilities.Revoke {
		return errdefs.NotFound
	}
	return errdefs.Unimplemented
}
