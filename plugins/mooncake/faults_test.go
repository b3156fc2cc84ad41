package mooncake_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/nocancel/nocanceltest"
	"github.com/kvfence/kvfence/plugins/mooncake"
	"github.com/kvfence/kvfence/sdk"
)

// fakeEnv loads the fake library with its faults switched on and short:
// an unacknowledged write reads FAILED after 300 ms (Mooncake: 30 s), and
// writes of 4 MiB or more have no status timeout (WAITING forever). The
// plugin reports a batch still WAITING after 1 s.
func fakeEnv(extra ...string) []string {
	return append([]string{mooncake.EnvLib + "=" + fakeLib, "KVFENCE_FAKE_STATUS_TIMEOUT_MS=300",
		"KVFENCE_FAKE_WAIT_FOREVER_BYTES=4194304", mooncake.EnvReportAfter + "=1s"}, extra...)
}

func newPair(t *testing.T, bin string, env, iniEnv []string) *nocanceltest.Pair {
	needFakes(t)
	var log *os.File
	if testing.Verbose() {
		log = os.Stderr
	}
	if log == nil {
		return nocanceltest.NewPair(t, bin, env, iniEnv, nil, nil)
	}
	return nocanceltest.NewPair(t, bin, env, iniEnv, nil, log)
}

// A healthy write over the fake: Succeeded with every byte there, and
// Quiesce has evidence for it.
func TestHealthyWrite(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv(), nil)
	b := p.Write(4096, 3<<20, 256<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	c, err := p.Wait(b.ID, 10*time.Second)
	if err != nil || c.Status != sdk.Succeeded || c.BytesLanded != 3<<20 || !p.Landed(4096, 3<<20) {
		t.Fatalf("completion %+v err %v landed %v", c, err, p.Landed(4096, 3<<20))
	}
	q, err := p.Ini.Transport().Quiesce(context.Background(), p.Peer, []sdk.BatchID{b.ID})
	if err != nil || q.Evidence != sdk.EvidenceCompletionsHarvested {
		t.Fatalf("Quiesce after Succeeded: %+v %v", q, err)
	}
}

// A library that prints on stdout (UCX's log does by default; the real
// NIXL plugin failed its handshake so with UCX_PROTO_INFO=y) must not break
// the plugin's handshake: its lines go to stderr, and writes still work.
func TestLibraryPrintingOnStdout(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv("KVFENCE_FAKE_STDOUT_NOISE=1"), nil)
	b := p.Write(4096, 64<<10, 64<<10)
	if err := p.Ini.Transport().Post(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if c, err := p.Wait(b.ID, 10*time.Second); err != nil || c.Status != sdk.Succeeded || !p.Landed(4096, 64<<10) {
		t.Fatalf("completion %+v err %v", c, err)
	}
}

// FAILED while the target is stopped, and the bytes land after SIGCONT:
// the plugin says InDoubt and Quiesce has no evidence.
func TestLateLandingAfterFailed(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv(), nil)
	o, err := nocanceltest.StoppedTarget(p, 1<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(o)
	if o.Broken != "" || o.Completion.Status != sdk.InDoubt {
		t.Fatalf("honest plugin: %v", o)
	}
	if !o.LateLanded {
		t.Fatalf("the fake's FAILED write never landed: the fault was not reproduced (%v)", o)
	}
}

// A deliberately dishonest variant that takes FAILED as proof must be
// caught, naming the promise it broke.
func TestFailedIsDefiniteIsCaught(t *testing.T) {
	p := newPair(t, unsafeBin, fakeEnv("KVFENCE_MOONCAKE_UNSAFE=failed-is-definite"), nil)
	o, err := nocanceltest.StoppedTarget(p, 1<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(o)
	if o.Completion.Status != sdk.FailedDefinite || o.Broken != nocanceltest.PromiseFailed {
		t.Fatalf("the failed-is-definite variant was not caught: %v", o)
	}
}

// A large write to a stopped target stays WAITING: the plugin reports
// InDoubt once at its deadline, keeps the batch, and sends no second
// completion when it ends.
func TestWaitingForever(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv(), nil)
	o, err := nocanceltest.StoppedTarget(p, 0, 8<<20, 8<<20, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(o)
	if o.Broken != "" || o.Completion.Status != sdk.InDoubt || !o.LateLanded {
		t.Fatalf("WAITING forever: %v", o)
	}
	st, err := p.Ini.Transport().(sdk.StatsReporter).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("initiator stats: %v", st)
}

// Legacy framing: COMPLETED once the bytes are sent. With the target
// stopped that is before anything was applied; the plugin must not say
// Succeeded.
func TestLegacyFraming(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv(), []string{"MC_TCP_PROTO=1"})
	o, err := nocanceltest.StoppedTarget(p, 2<<20, 256<<10, 64<<10, 10*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(o)
	if o.Broken != "" || o.Completion.Status == sdk.Succeeded {
		t.Fatalf("legacy framing: %v", o)
	}
}

// Deregistration is not revocation: target memory with a key is refused,
// and Revoke is not offered.
func TestTargetMemoryStaysExposed(t *testing.T) {
	p := newPair(t, pluginBin, fakeEnv(), nil)
	ctx := context.Background()
	if err := p.Tgt.Transport().DeregisterMemory(ctx, p.DstID); !errdefs.Is(err, errdefs.FailedPrecondition) {
		t.Fatalf("DeregisterMemory with an unrevocable key: %v", err)
	}
	info, err := p.Tgt.Transport().Info(ctx)
	if err != nil || info.Capabilities.Revoke || info.Capabilities.MaxTail < 24*time.Hour {
		t.Fatalf("capabilities: %+v %v", info.Capabilities, err)
	}
	if _, err := p.Tgt.Transport().(sdk.Granter).Revoke(ctx, p.Key); !errdefs.Is(err, errdefs.Unimplemented) {
		t.Fatalf("Revoke: %v", err)
	}
}
