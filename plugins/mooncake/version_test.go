package mooncake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/mooncake"
	"github.com/kvfence/kvfence/sdk"
)

// stats reads a plugin's counters.
func stats(t *testing.T, tr sdk.Transport) map[string]uint64 {
	t.Helper()
	st, err := tr.(sdk.StatsReporter).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitStat waits, one poll at a time, for counter key to reach want.
func waitStat(t *testing.T, tr sdk.Transport, key string, want uint64, cmp func(got, want uint64) bool) map[string]uint64 {
	t.Helper()
	var st map[string]uint64
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if st = stats(t, tr); cmp(st[key], want) {
			return st
		}
	}
	t.Fatalf("%s never reached %d: %v", key, want, st)
	return nil
}

func atLeast(got, want uint64) bool { return got >= want }
func exactly(got, want uint64) bool { return got == want }

// Mooncake over RDMA posts slices as they accumulate and can refuse a
// later one: submitTransfer returns AddressNotRegistered with part of the
// batch on the wire. Post must not say "nothing was sent": it accepts the
// batch, keeps its source pinned, and reports it InDoubt once every task
// ended, though every task reads COMPLETED (an older engine says so of the
// tasks it never posted); the batch is freed only then.
func TestSubmitFailsPartWay(t *testing.T) {
	const op = 64 << 10
	p := newPair(t, pluginBin, fakeEnv(mooncake.EnvProtocol+"=rdma", "KVFENCE_FAKE_SUBMIT_FAIL_AFTER=2"), nil)
	b := p.Write(0, 4*op, op)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatalf("Post returned %v after the library sent part of the batch (an error promises nothing moved)", err)
	}
	c, err := p.Wait(b.ID, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != sdk.InDoubt || c.BytesLanded != 0 {
		t.Fatalf("completion %+v: want InDoubt claiming no bytes (two tasks were never posted, yet read COMPLETED)", c)
	}
	if !p.Landed(0, 2*op) {
		t.Fatal("the fake did not send the first two writes: the fault was not reproduced")
	}
	if p.Landed(2*op, 2*op) {
		t.Fatal("the fake sent writes it refused")
	}
	st := waitStat(t, p.Ini.Transport(), "batches_live", 0, exactly)
	if st["submit_refused_after_call"] != 1 {
		t.Fatalf("stats %v: want one submit refused after the call", st)
	}
	if err := p.Ini.Transport().DeregisterMemory(context.Background(), p.SrcID); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("DeregisterMemory of the refused batch's source: %v (the library may still read it)", err)
	}
	q, err := p.Ini.Transport().Quiesce(context.Background(), p.Peer, []sdk.BatchID{b.ID})
	if err == nil {
		t.Fatalf("Quiesce claimed evidence for a part-refused batch: %+v", q)
	}
}

// A failed getTransferStatus says nothing about the task: it is polled
// again, the healthy write still Succeeds and its batch is freed.
func TestStatusPollFailuresRetried(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv(), []string{"KVFENCE_FAKE_STATUS_FAIL_FIRST=20"})
	b := p.Write(4096, 256<<10, 64<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	c, err := p.Wait(b.ID, 20*time.Second)
	if err != nil || c.Status != sdk.Succeeded || !p.Landed(4096, 256<<10) {
		t.Fatalf("completion %+v err %v: a failed status read was taken as the task's end", c, err)
	}
	st := waitStat(t, p.Ini.Transport(), "batches_live", 0, exactly)
	if st["poll_errors"] < 20 || st["free_refused"] != 0 {
		t.Fatalf("stats %v: want 20 poll errors retried and no refused free", st)
	}
}

// A library older than v0.3.12 (no getNicLoadStats) speaks only the legacy
// TCP framing: COMPLETED once queued. With the plugin's defaults (v2
// configured) its writes must still end InDoubt, Info.Version must say so,
// and with the target stopped nothing is reported Succeeded.
func TestLegacyLibrary(t *testing.T) {
	env := []string{mooncake.EnvLib + "=" + legacyLib, "KVFENCE_FAKE_STATUS_TIMEOUT_MS=300", mooncake.EnvReportAfter + "=1s"}
	p := newPair(t, pluginBin, env, nil)
	b := p.Write(4096, 256<<10, 64<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if c, err := p.Wait(b.ID, 20*time.Second); err != nil || c.Status != sdk.InDoubt {
		t.Fatalf("completion %+v err %v: a legacy library's COMPLETED was taken as applied", c, err)
	}
	info, err := p.Ini.Transport().Info(context.Background())
	if err != nil || !strings.Contains(info.Version, "legacy TCP framing") {
		t.Fatalf("Info %+v %v: the version does not say the library is legacy", info, err)
	}
	t.Log(info.Version)
	o, err := nocanceltest.StoppedTarget(p, 2<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(o)
	if o.Broken != "" || o.Completion.Status == sdk.Succeeded {
		t.Fatalf("legacy library, target stopped: %v", o)
	}
}
