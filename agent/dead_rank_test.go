package agent

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
)

// deadRankDecodeEnv names the decode address a helper prefill process links
// to; the helper runs only when it is set.
const deadRankDecodeEnv = "KVFENCE_TEST_PREFILL_DECODE_ADDR"

// TestHelperPrefillRankProcess is not a test: it is prefill rank 1 as its own
// process (the test binary run again), for a test to kill -9.
func TestHelperPrefillRankProcess(t *testing.T) {
	addr := os.Getenv(deadRankDecodeEnv)
	if addr == "" {
		t.Skip("helper process only")
	}
	pp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPrefill(context.Background(), PrefillConfig{Rank: 1, DecodeAddr: addr, SourcePages: 4, ShardBytes: 4096,
		Lanes: 1, MaxInflight: 4, MaxBatchPages: 4, Heartbeat: 100 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
		RequestTombstone: 5 * time.Second, BootstrapTimeout: 5 * time.Second, Events: pp.Events()}, pp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	_ = p
	select {} // until killed
}

// A prefill rank's process is killed with SIGKILL; once decode declares it
// dead, an admission that names it is refused at once, with an Unavailable
// error naming the rank, and nothing is exposed or held: it is not admitted
// and then held for lease + tail + margin waiting for a rank that will
// never write, commit or drain.
func TestAdmissionNamingAKilledRankIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 16, ShardBytes: 4096, Shards: 1,
		Lease: 2 * time.Second, MaxHold: 10 * time.Second, PeerDeadAfter: 200 * time.Millisecond, Fence: true,
		Check: oracle.Check{}, ControlAddr: "127.0.0.1:0"}, dp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	child := helperProcess(t, "TestHelperPrefillRankProcess", deadRankDecodeEnv+"="+d.Addr())
	exited := startHelper(t, child)
	waitFor(t, "prefill rank 1 linked", func() bool {
		select {
		case <-exited:
			t.Fatalf("helper prefill rank exited before it linked: %v", child.ProcessState)
		default:
		}
		return gaugeWithRank(t, d.Metrics, "kvfence_writer_tail_seconds", "1")
	})

	// Linked and alive: an admission that names it is exposed.
	live := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1})
	if _, err := live.Init(1, []core.RankID{1}); err != nil {
		t.Fatalf("admission naming a live rank: %v", err)
	}

	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	waitFor(t, "rank 1 declared dead", func() bool { return d.Stats().Core.PeerDeaths == 1 })
	// Room 1's hold ends (fenced) on its own time: let it end first, so the
	// counts below move only for the refused admission.
	waitFor(t, "room 1's hold released", func() bool {
		c := d.Stats().Core
		return c.HeldSlots == 0 && c.AssignedSlots == 0
	})

	before := d.Stats().Core
	rv := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1})
	start := time.Now()
	tag, err := rv.Init(1, []core.RankID{1})
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "prefill rank 1") {
		t.Fatalf("admission naming dead rank 1: tag %v, err = %v; want Unavailable naming rank 1", tag, err)
	}
	t.Logf("refused in %v: %v", time.Since(start), err)
	after := d.Stats().Core
	if after.Admitted != before.Admitted || after.HeldSlots != before.HeldSlots || after.AssignedSlots != before.AssignedSlots {
		t.Fatalf("a refused admission exposed or held memory: before %+v after %+v", before, after)
	}
}

// helperProcess is the test binary run again as helper test name, with env
// added (not started yet).
func helperProcess(t *testing.T, name, env string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe, "-test.run=^"+name+"$")
	child.Env = append(os.Environ(), env)
	child.Stderr = os.Stderr
	return child
}

// startHelper starts a helper process and reaps it: the channel closes
// when it has ended (child.ProcessState is then set), so a wait for its
// link fails at once if it died instead of spending the whole wait.
// Cleanup kills it. Nothing else may call child.Wait.
func startHelper(t *testing.T, child *exec.Cmd) <-chan struct{} {
	t.Helper()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() { _ = child.Process.Kill(); <-exited })
	return exited
}

// gaugeWithRank says whether a gauge has a sample labelled with rank.
func gaugeWithRank(t *testing.T, m *Metrics, name, rank string) bool {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == "peer_rank" && lp.GetValue() == rank {
					return true
				}
			}
		}
	}
	return false
}
