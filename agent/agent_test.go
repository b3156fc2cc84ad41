package agent

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
)

// pluginBin is the TCP plugin; testDir holds what tests build (removed at
// the end).
var pluginBin, testDir string

// TestMain builds the real TCP plugin: every test here loads it out of
// process, as an engine would.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-agent-test-")
	if err != nil {
		panic(err)
	}
	testDir = dir
	pluginBin = filepath.Join(dir, "kvfence-plugin-tcp")
	if out, err := exec.Command("go", "build", "-o", pluginBin, "../plugins/tcp/cmd/kvfence-plugin-tcp").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func startDecode(t testing.TB) *Decode {
	t.Helper()
	p, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 64, ShardBytes: 4096, Shards: 2,
		Lease: 2 * time.Second, MaxHold: 10 * time.Second, Fence: true, Check: oracle.Check{}, ControlAddr: "127.0.0.1:0"}, p.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func counter(t testing.TB, m *Metrics, name, label string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "reason" && lp.GetValue() == label {
					v += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return v
}

// waitForBudget bounds one waitFor.
const waitForBudget = 90 * time.Second

// waitFor waits for one event, polling cond. The budget is per wait and
// generous: an event that needs a process started (a helper rank, its
// plugin) took over 10 s on a 2-core machine loaded by a parallel make test
// (TestAdmissionNamingAKilledRankIsRefused: "timed out waiting for prefill
// rank 1 linked"); only a failing run pays for it.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitForBudget); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A rank may speak only for itself, only for tags whose assignment names
// it, and never replay a frame: each is refused at the agent and counted,
// and the exposure stays held.
func TestForgedForeignAndReplayedMessagesAreRefused(t *testing.T) {
	d := startDecode(t)
	ctx := context.Background()
	l, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	// Assigned to rank 2 only: rank 1 is foreign to it.
	rv := d.NewReceiver(core.RequestKey{Room: 7, Gen: 1})
	tag, err := rv.Init(2, []core.RankID{2})
	if err != nil {
		t.Fatal(err)
	}
	send := func(m core.Message) { l.send(&frame{Type: frameCore, Core: core.AppendMessage(nil, &m)}) }
	// Forged: rank 1's link claims to be rank 2.
	send(core.Message{Kind: core.KindCommit, Tag: tag, Rank: 2, Decode: 0, Coverage: 2})
	// Foreign: rank 1 speaks for itself about a tag that does not name it.
	send(core.Message{Kind: core.KindDrainAck, Tag: tag, Rank: 1, Decode: 0, Evidence: core.EvidenceCompleted})
	// Replayed: a frame with a sequence number already used.
	m := core.Message{Kind: core.KindCommit, Tag: tag, Rank: 1, Decode: 0, Coverage: 2}
	if err := l.s.SendMsg(&frame{Type: frameCore, Seq: 1, Core: core.AppendMessage(nil, &m)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "forged", func() bool { return counter(t, d.Metrics, "kvfence_rejected_messages_total", "forged") == 1 })
	waitFor(t, "foreign", func() bool { return counter(t, d.Metrics, "kvfence_rejected_messages_total", "foreign") == 1 })
	waitFor(t, "replayed", func() bool { return counter(t, d.Metrics, "kvfence_rejected_messages_total", "replayed") == 1 })
	if st := rv.Poll(); st != PollWaitingForInput {
		t.Fatalf("poll = %s after refused messages, want WaitingForInput", st)
	}
	if s := d.Stats(); s.Handoffs != 0 || s.Core.Released[core.PathDrained] != 0 {
		t.Fatalf("a refused message changed the exposure: %+v", s.Core)
	}
}

// Peers that disagree on the protocol version, or a prefill rank whose
// transport cannot prove quiescence, are refused with words that say why.
func TestIncompatiblePeersAreRefused(t *testing.T) {
	d := startDecode(t)
	ctx := context.Background()
	_, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion + 1, Caps: peerCaps{Quiesce: true}})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "incompatible peers") {
		t.Fatalf("version mismatch: err = %v", err)
	}
	_, _, err = dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cannot prove quiescence") {
		t.Fatalf("no quiescence: err = %v", err)
	}
}

// Decode bounds each prefill rank's writes by the tail that rank's own
// transport declared in its Hello (when longer than decode's), because a
// write's tail belongs to the writer's transport; a negative one is refused.
func TestDecodeUsesWriterDeclaredTail(t *testing.T) {
	d := startDecode(t)
	ctx := context.Background()
	own := d.info.Capabilities.MaxTail
	for rank, declared := range map[uint32]time.Duration{1: own + 5*time.Second, 2: 0} {
		l, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: rank, ShardBytes: 4096, Version: ControlVersion,
			Caps: peerCaps{Quiesce: true, MaxTail: int64(declared)}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.close()
		want := max(declared, own).Seconds()
		waitFor(t, "the writer tail gauge", func() bool { return writerTail(t, d.Metrics, rank) == want })
	}
	_, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 3, ShardBytes: 4096, Version: ControlVersion,
		Caps: peerCaps{Quiesce: true, MaxTail: -1}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "negative transport tail") {
		t.Fatalf("negative tail: err = %v", err)
	}
}

func writerTail(t *testing.T, m *Metrics, rank uint32) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvfence_writer_tail_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "peer_rank" && lp.GetValue() == itoa(int(rank)) {
					return mt.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}
