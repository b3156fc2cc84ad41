package agent

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
)

// misdirectingTransport is a transport that lies: it reads the first op of
// the first batch it posts from the wrong source page and still reports
// success — what an optional checksum at commit exists to catch.
type misdirectingTransport struct {
	sdk.Transport
	once  sync.Once
	shard uint64
}

func (t *misdirectingTransport) Post(ctx context.Context, b sdk.Batch) error {
	t.once.Do(func() {
		ops := append([]sdk.Op(nil), b.Ops...)
		ops[0].LocalOffset += t.shard // the next source page: someone else's bytes
		b.Ops = ops
	})
	return t.Transport.Post(ctx, b)
}

type checksumRun struct {
	state        PollState
	mismatches   float64
	corrupt      int
	handoffs     int
	releasedPath map[string]int
	atAbort      bool // decode revokes at the abort (Stats.RevokeAtAbort)
}

// runChecksummed moves one 4-page request from a prefill rank (whose
// transport misdirects one write when lie is set) to a decode rank, with
// checksums on or off on each side.
func runChecksummed(t *testing.T, decodeSums, prefillSums, lie bool) checksumRun {
	t.Helper()
	const shard = 4096
	var wrap func(sdk.Transport) sdk.Transport
	if lie {
		wrap = func(tr sdk.Transport) sdk.Transport { return &misdirectingTransport{Transport: tr, shard: shard} }
	}
	d, p := startPair(t, func(c *DecodeConfig) { c.Checksums = decodeSums }, func(c *PrefillConfig) { c.Checksums = prefillSums }, wrap)

	key := core.RequestKey{Room: 7, Gen: 1}
	rv := d.NewReceiver(key)
	if _, err := rv.Init(4, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	snd := p.NewSender(key)
	if err := snd.Init(4); err != nil {
		t.Fatal(err)
	}
	sendWhole(t, snd, key, 4)
	var run checksumRun
	waitFor(t, "request to end", func() bool {
		run.state = rv.Poll()
		return run.state == PollSuccess || run.state == PollFailed
	})
	if run.state == PollFailed {
		waitFor(t, "the failed request's memory to be released", rv.Released)
	}
	st := d.Stats()
	run.corrupt, run.handoffs, run.releasedPath, run.atAbort = st.CorruptPages, st.Handoffs, st.Released, st.RevokeAtAbort
	mfs, err := d.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvfence_checksum_mismatches_total" {
			run.mismatches = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return run
}

// With checksums, a write the transport misdirected (and reported as a
// success) is caught at commit: the request is aborted and never handed
// off, and its memory goes back only once the rank drained (or, where
// decode revokes at the abort, once its keys are revoked, if that comes
// first). Without them
// (the unsafe arm) the same run hands off a page holding another page's
// bytes — which only the demo's content oracle sees.
func TestChecksumAtCommitCatchesMisdirectedWrite(t *testing.T) {
	t.Run("checksums", func(t *testing.T) {
		r := runChecksummed(t, true, true, true)
		if r.state != PollFailed || r.handoffs != 0 || r.mismatches != 1 {
			t.Fatalf("want an aborted request and one mismatch, got state %v handoffs %d mismatches %v", r.state, r.handoffs, r.mismatches)
		}
		safe := r.releasedPath["drained"]
		if r.atAbort {
			safe += r.releasedPath["fenced"]
		}
		if safe != 1 || len(r.releasedPath) != 1 {
			t.Fatalf("the aborted request should be released drained (or fenced, revoking at the abort: %v), got %v", r.atAbort, r.releasedPath)
		}
	})
	t.Run("unsafe-no-checksums", func(t *testing.T) {
		r := runChecksummed(t, false, false, true)
		if r.state != PollSuccess || r.corrupt == 0 {
			t.Fatalf("without checksums the misdirected page should be handed off and seen by the oracle: state %v corrupt %d", r.state, r.corrupt)
		}
	})
	t.Run("clean", func(t *testing.T) {
		r := runChecksummed(t, true, true, false)
		if r.state != PollSuccess || r.mismatches != 0 || r.corrupt != 0 {
			t.Fatalf("a clean transfer must hand off: state %v mismatches %v corrupt %d", r.state, r.mismatches, r.corrupt)
		}
	})
}

// A decode rank that requires checksums refuses a prefill rank that does
// not compute them, with a reason an operator can act on.
func TestChecksumRequiredRefusesPrefillWithout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	d, err := NewDecode(ctx, DecodeConfig{Rank: 0, Slots: 4, ShardBytes: 4096, Shards: 1, Lease: time.Second, MaxHold: 5 * time.Second,
		Checksums: true, ControlAddr: "127.0.0.1:0"}, dp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, _, err = dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "requires checksums") {
		t.Fatalf("want a refusal naming checksums, got %v", err)
	}
}

func BenchmarkCommitChecksum(b *testing.B) {
	// 16 pages × 64 KiB: a request's shard on one rank. The baseline is a
	// copy of the same bytes, the least any transfer costs in memory traffic.
	shards := make([][]byte, 16)
	for i := range shards {
		shards[i] = make([]byte, 64<<10)
		oracle.FillShard(shards[i], oracle.PageIdentity{Room: 1, Gen: 1, Page: uint32(i)})
	}
	dst := make([]byte, 64<<10)
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(16 << 16)
		for b.Loop() {
			for _, s := range shards {
				copy(dst, s)
			}
		}
	})
	b.Run("crc32c", func(b *testing.B) {
		b.SetBytes(16 << 16)
		for b.Loop() {
			_ = commitChecksum(shards)
		}
	})
}
