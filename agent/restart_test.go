package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The restart fence needs a transport that cannot revoke. Two run here:
// the Mooncake plugin over this project's fake Transfer Engine library
// (restart_vendor_test.go: a real non-revoking plugin declaring an
// unbounded tail), and the TCP plugin with Revoke masked — Info declares
// Revoke=false and Revoke itself refuses — which keeps a restart-fence test
// in `go test` where no C compiler is installed. Either way it is the real
// plugin process whose end the fence relies on.
//
// Target instances die slowly: Close waits dieAfter before ending the
// process, as a process does that deregisters much memory or drains a NIC
// queue. Its data connections keep delivering meanwhile, so a release
// before the reap (the control arm) lets writes land in freed memory.
type slowDeath struct {
	*sdk.Plugin
	dieAfter time.Duration
}

func (p slowDeath) Close() error {
	time.Sleep(p.dieAfter)
	return p.Plugin.Close()
}

// noRevokeProcess is a TCP plugin instance with Revoke masked.
type noRevokeProcess struct{ slowDeath }

func (p noRevokeProcess) Transport() sdk.Transport { return noRevoke{p.Plugin.Transport()} }

// restartBackend is the non-revoking transport a restart-fence scenario
// runs over: how to start one target instance and the writer's data path.
type restartBackend struct {
	name   string
	target func() (TargetProcess, error)
	writer func(t *testing.T) sdk.Transport
}

// maskedTCP is the TCP plugin with Revoke masked.
func maskedTCP(dieAfter time.Duration) restartBackend {
	return restartBackend{name: "masked-tcp",
		target: func() (TargetProcess, error) {
			p, err := sdk.Open(pluginBin, sdk.OpenOptions{})
			if err != nil {
				return nil, err
			}
			return noRevokeProcess{slowDeath{p, dieAfter}}, nil
		},
		writer: func(t *testing.T) sdk.Transport {
			return sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{}).Transport()
		},
	}
}

type noRevoke struct{ sdk.Transport }

func (n noRevoke) Info(ctx context.Context) (sdk.Info, error) {
	i, err := n.Transport.Info(ctx)
	i.Capabilities.Revoke = false
	return i, err
}

func (n noRevoke) Grant(ctx context.Context, w sdk.Window) (sdk.Key, error) {
	return n.Transport.(sdk.Granter).Grant(ctx, w)
}

func (n noRevoke) Revoke(context.Context, sdk.Key) (sdk.RevokeResult, error) {
	return sdk.RevokeResult{}, errdefs.Errorf(errdefs.Unimplemented, "this transport cannot revoke (masked for the restart-fence test)")
}

const restartWriterEnv = "KVFENCE_TEST_RESTART_DECODE_ADDR"

// unboundedTail is what a writer declares when its bytes may land at any
// time (a backend that retries for ever): only a restart fence admits it.
const unboundedTail = 50 * 365 * 24 * time.Hour

// assignedKeys is what the helper writer prints when its Assign comes.
type assignedKeys struct {
	Tag     core.Tag     `json:"tag"`
	Keys    []keyRef     `json:"keys"`
	Targets []dataTarget `json:"targets"`
}

// TestHelperRestartWriterProcess is not a test: it is prefill rank 1's
// control plane as its own process (the test binary again), declaring an
// unbounded tail, for the test to kill -9 while its writes still run.
func TestHelperRestartWriterProcess(t *testing.T) {
	addr := os.Getenv(restartWriterEnv)
	if addr == "" {
		t.Skip("helper process only")
	}
	l, _, err := dial(context.Background(), addr, nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096,
		Version: ControlVersion, Caps: peerCaps{Quiesce: true, MaxTail: int64(unboundedTail)}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		f, err := l.recv(nil)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := core.DecodeMessage(f.Core); err == nil && m.Kind == core.KindAssign {
			b, _ := json.Marshal(assignedKeys{Tag: m.Tag, Keys: f.Keys, Targets: l.peer.DataTargets})
			fmt.Println(string(b))
		}
	}
}

// restartRun is what one run of the scenario saw.
type restartRun struct {
	stats        DecodeStats
	landed, lost int64 // the writer's writes that completed / failed
	// the Prometheus counters of restarts and of the exposures they failed
	restartsMetric, failedMetric float64
}

// runRestartScenario: decode with a restart fence over targets instances of
// the backend's plugin and 2 slots. Request A names rank 1 (a helper
// process declaring an unbounded tail); request B names rank 2, which never
// writes (the bystander). A writer whose data path outlives rank 1's
// process — a backend that keeps retrying — writes A's page again and
// again; rank 1 is killed with SIGKILL mid-way. Decode declares it dead,
// the core asks for A's instance to be restarted, and A's hold ends at the
// reap. Then new requests are admitted into every free slot (A's among them), and the content
// check looks for any write that landed there while it was free.
func runRestartScenario(t *testing.T, targets int, be restartBackend) restartRun {
	t.Helper()
	ctx := context.Background()
	d, err := NewDecode(ctx, DecodeConfig{Rank: 0, Slots: 2, ShardBytes: 4096, Shards: 1, Lease: 2 * time.Second,
		MaxHold: 10 * time.Second, PeerDeadAfter: 200 * time.Millisecond, Check: oracle.Check{}, ControlAddr: "127.0.0.1:0",
		Restart: &RestartConfig{Targets: targets, After: 5 * time.Second, Open: func(context.Context) (TargetProcess, error) { return be.target() }}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)

	child := helperProcess(t, "TestHelperRestartWriterProcess", restartWriterEnv+"="+d.Addr())
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	waitFor(t, "writer rank 1 linked", func() bool { return gaugeWithRank(t, d.Metrics, "kvfence_writer_tail_seconds", "1") })

	rvA := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1})
	tagA, err := rvA.Init(1, []core.RankID{1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1}).Init(1, []core.RankID{2}); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	var got assignedKeys
	for got.Tag != tagA {
		if !lines.Scan() {
			t.Fatalf("the writer printed no keys for %v", tagA)
		}
		if json.Unmarshal(lines.Bytes(), &got) != nil {
			continue
		}
	}
	if len(got.Keys) != 1 || got.Keys[0].Target >= len(got.Targets) {
		t.Fatalf("keys %+v for targets %+v", got.Keys, got.Targets)
	}

	// The writer's data path: its own plugin process, not the helper's.
	tr := be.writer(t)
	src, err := sdk.NewSharedMemory("restart-writer-src", 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	oracle.FillShard(src.Bytes(), oracle.PageIdentity{Room: tagA.Room, Gen: tagA.Gen, Page: 0, Rank: 1})
	region, err := tr.RegisterMemory(ctx, src.Desc())
	if err != nil {
		t.Fatal(err)
	}
	dt := got.Targets[got.Keys[0].Target]
	peer, err := tr.Connect(ctx, sdk.Endpoint{Transport: dt.Transport, Address: dt.Address, Opaque: dt.Opaque})
	if err != nil {
		t.Fatal(err)
	}
	var run restartRun
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for id := sdk.BatchID(1); ; id++ {
			select {
			case <-stop:
				return
			default:
			}
			if tr.Post(ctx, sdk.Batch{ID: id, Peer: peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: region,
				RemoteKey: sdk.Key(got.Keys[0].Key), RemoteOffset: got.Keys[0].Base, Length: 4096}}}) != nil {
				atomic.AddInt64(&run.lost, 1)
				time.Sleep(time.Millisecond)
				continue
			}
			select {
			case c := <-tr.Completions():
				if c.Status == sdk.Succeeded {
					atomic.AddInt64(&run.landed, 1)
				} else {
					atomic.AddInt64(&run.lost, 1)
				}
			case <-time.After(5 * time.Second):
				atomic.AddInt64(&run.lost, 1)
			}
		}
	}()
	waitFor(t, "the writer's first writes land", func() bool { return atomic.LoadInt64(&run.landed) >= 10 })

	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	waitFor(t, "the target instance restarted", func() bool { return d.Stats().TargetRestarts >= 1 })
	waitFor(t, "A's hold released", rvA.Released)
	time.Sleep(100 * time.Millisecond) // the writer keeps trying against the dead instance
	close(stop)
	wg.Wait()
	// Every free slot (A's among them) is exposed again: the content check
	// sees any write that landed in it while it was free.
	for room := uint64(3); room < 5; room++ {
		if _, err := d.NewReceiver(core.RequestKey{Room: room, Gen: 1}).Init(1, []core.RankID{3}); err != nil {
			if room == 3 {
				t.Fatalf("admission into A's freed slot: %v", err)
			}
			break
		}
	}
	run.stats = d.Stats()
	run.restartsMetric = unlabelledCounter(t, d.Metrics, "kvfence_target_restarts_total")
	run.failedMetric = unlabelledCounter(t, d.Metrics, "kvfence_restart_failed_exposures_total")
	return run
}

// TestRestartFenceEndsHoldOfKilledUnboundedWriter: on a transport that
// cannot revoke, a writer declaring an unbounded tail is admitted (only
// because of the restart fence), killed mid-transfer while its data path
// keeps writing, and its hold ends fenced — by the restart, not by a
// timeout, which never comes for an unbounded tail — with no write landing
// in the freed slot. With one instance the bystander B fails with it; with
// two it sits on the other instance (the blast radius).
func TestRestartFenceEndsHoldOfKilledUnboundedWriter(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, targets := range []int{1, 2} {
		t.Run(fmt.Sprintf("targets=%d", targets), func(t *testing.T) {
			checkRestartFenced(t, targets, runRestartScenario(t, targets, maskedTCP(200*time.Millisecond)))
		})
	}
}

// checkRestartFenced: A's hold ended fenced, nothing landed in free memory,
// the old instance really ended, and the blast radius is what the
// scenario's layout makes it.
func checkRestartFenced(t *testing.T, targets int, run restartRun) {
	t.Helper()
	s := run.stats
	t.Logf("targets=%d: restarts %d, live exposures failed by restarts %d (blast radius), released %v, writes landed %d / failed %d, corrupt pages %d",
		targets, s.TargetRestarts, s.Core.RestartFailed, s.Released, run.landed, run.lost, s.CorruptPages)
	if s.Released["fenced"] < 1 || s.Released["timeout"] != 0 || s.Released["unsafe"] != 0 {
		t.Fatalf("A's hold ended %v; want fenced by the restart", s.Released)
	}
	if s.CorruptPages != 0 || s.FreeWrites != 0 {
		t.Fatalf("%d corrupt pages, %d writes into free memory", s.CorruptPages, s.FreeWrites)
	}
	if run.lost == 0 {
		t.Fatalf("the writer's writes never failed: the old instance was not ended")
	}
	wantFailed := uint64(0)
	if targets == 1 {
		wantFailed = 1 // B shared A's instance
	}
	if s.Core.RestartFailed != wantFailed {
		t.Fatalf("restart failed %d live exposures, want %d", s.Core.RestartFailed, wantFailed)
	}
	if run.restartsMetric != float64(s.Core.TargetRestarts) || run.failedMetric != float64(wantFailed) {
		t.Fatalf("metrics: %v restarts, %v failed exposures; want %d, %d", run.restartsMetric, run.failedMetric, s.Core.TargetRestarts, wantFailed)
	}
}

// transfer moves pages pages for key from prefill rank 1 to decode and
// checks that decode reads exactly them; the request stays open.
func transfer(t *testing.T, p *Prefill, rv *KVReceiver, key core.RequestKey, pages int) *KVSender {
	t.Helper()
	snd := p.NewSender(key)
	if err := snd.Init(pages); err != nil {
		t.Fatal(err)
	}
	for i := range pages {
		oracle.FillShard(snd.Page(i), oracle.PageIdentity{Room: key.Room, Gen: key.Gen, Page: uint32(i), Rank: 1})
	}
	if err := snd.Send(pages); err != nil {
		t.Fatal(err)
	}
	if err := snd.Finish(pages); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rv.Done():
	case <-time.After(waitForBudget):
		t.Fatalf("request %v never reached a final state", key)
	}
	if rv.Poll() != PollSuccess || rv.Err() != nil {
		t.Fatalf("request %v: %v (%v)", key, rv.Poll(), rv.Err())
	}
	for i, pg := range rv.Pages() { // nil: an engine page the host cannot see
		if pg != nil && !bytes.Equal(pg, snd.Page(i)) {
			t.Fatalf("request %v: page %d differs from what prefill wrote", key, i)
		}
	}
	return snd
}

// A real prefill agent under a restart fence with two target instances:
// requests bound to either instance complete through the lanes prefill
// opened to that instance; target instance 0's process is then killed
// (a crash decode did not ask for), decode reaps it, starts a new one and
// announces it, and the next request — bound to the new instance — is
// carried by lanes prefill opened to the announced endpoint.
func TestRestartFenceServesPrefillAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx := context.Background()
	var mu sync.Mutex
	var procs []*sdk.Plugin
	d, err := NewDecode(ctx, DecodeConfig{Rank: 0, Slots: 8, ShardBytes: 4096, Shards: 1, Lease: 2 * time.Second,
		MaxHold: 10 * time.Second, Check: oracle.Check{}, ControlAddr: "127.0.0.1:0",
		Restart: &RestartConfig{Targets: 2, After: 5 * time.Second, Open: func(context.Context) (TargetProcess, error) {
			p, err := sdk.Open(pluginBin, sdk.OpenOptions{})
			if err != nil {
				return nil, err
			}
			mu.Lock()
			procs = append(procs, p)
			mu.Unlock()
			return noRevokeProcess{slowDeath{Plugin: p}}, nil
		}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	pp := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
	ptr := &peerCounting{Transport: pp.Transport(), live: map[sdk.PeerID]bool{}}
	p, err := NewPrefill(ctx, PrefillConfig{Rank: 1, DecodeAddr: d.Addr(), SourcePages: 8, ShardBytes: 4096, Lanes: 2,
		MaxInflight: 8, MaxBatchPages: 4, Heartbeat: 100 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
		RequestTombstone: 5 * time.Second, BootstrapTimeout: 5 * time.Second, Events: pp.Events()}, ptr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	waitFor(t, "prefill linked", p.Linked)

	var rvs []*KVReceiver
	var snds []*KVSender
	for room := uint64(1); room <= 2; room++ {
		rvs = append(rvs, admitOn(t, d, core.RequestKey{Room: room, Gen: 1}, int(room-1)))
	}
	for i, rv := range rvs {
		snds = append(snds, transfer(t, p, rv, core.RequestKey{Room: uint64(i + 1), Gen: 1}, 2))
	}
	// Both instances register the same pool (keys may even coincide), so
	// the pages are right whichever instance carried them: each instance's
	// own count of applied writes shows the routing.
	mu.Lock()
	inst := append([]*sdk.Plugin(nil), procs...)
	mu.Unlock()
	if a0, a1 := applied(t, inst[0]), applied(t, inst[1]); a0 != 2 || a1 != 2 {
		t.Fatalf("instance 0 applied %d writes, instance 1 %d; want 2 each (one request each)", a0, a1)
	}
	for i, rv := range rvs {
		rv.Finish()
		snds[i].Close()
		waitFor(t, "slots back", rv.Released)
	}

	if err := syscall.Kill(inst[0].Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "instance 0 restarted", func() bool { return d.Stats().TargetRestarts == 1 })

	key := core.RequestKey{Room: 3, Gen: 1}
	rv := admitOn(t, d, key, 0) // the least loaded: the new instance 0
	snd := transfer(t, p, rv, key, 2)
	rv.Finish()
	snd.Close()
	waitFor(t, "slots back", rv.Released)
	mu.Lock()
	fresh := procs[len(procs)-1]
	mu.Unlock()
	if a0, a1 := applied(t, fresh), applied(t, inst[1]); a0 != 2 || a1 != 2 {
		t.Fatalf("after the restart the new instance 0 applied %d writes, instance 1 %d in all; want 2 each", a0, a1)
	}
	if s := d.Stats(); s.CorruptPages != 0 || s.Handoffs != 3 {
		t.Fatalf("corrupt pages %d, handoffs %d (want 0, 3)", s.CorruptPages, s.Handoffs)
	}
	// Prefill keeps lanes to the live instances only: those to the
	// replaced instance 0 were disconnected, not left in its plugin.
	if live, connects := ptr.counts(); live != 2*2 || connects != 3*2 {
		t.Fatalf("prefill's plugin holds %d peers after %d connects; want 4 (2 lanes × 2 instances) of 6", live, connects)
	}
}

// peerCounting counts the peers a prefill rank's transport holds.
type peerCounting struct {
	sdk.Transport
	mu       sync.Mutex
	live     map[sdk.PeerID]bool
	connects int
}

func (c *peerCounting) Connect(ctx context.Context, ep sdk.Endpoint) (sdk.PeerID, error) {
	id, err := c.Transport.Connect(ctx, ep)
	if err == nil {
		c.mu.Lock()
		c.live[id] = true
		c.connects++
		c.mu.Unlock()
	}
	return id, err
}

func (c *peerCounting) Disconnect(ctx context.Context, id sdk.PeerID) error {
	c.mu.Lock()
	delete(c.live, id)
	c.mu.Unlock()
	return c.Transport.Disconnect(ctx, id)
}

func (c *peerCounting) counts() (live, connects int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live), c.connects
}

// applied is how many writes a target instance's TCP plugin applied.
func applied(t *testing.T, p *sdk.Plugin) uint64 {
	t.Helper()
	st, err := p.Transport().(sdk.StatsReporter).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st["tcp.writes_applied"]
}

// admitOn admits a 2-page request from rank 1 and checks that the core
// bound it to target instance want.
func admitOn(t *testing.T, d *Decode, key core.RequestKey, want int) *KVReceiver {
	t.Helper()
	rv := d.NewReceiver(key)
	tag, err := rv.Init(2, []core.RankID{1})
	if err != nil {
		t.Fatal(err)
	}
	var target int
	d.lp.call(func() { target, _ = d.core.Target(tag) })
	if target != want {
		t.Fatalf("request %v is on instance %d, want %d (the least loaded)", key, target, want)
	}
	return rv
}

// unlabelledCounter is the value of a counter without variable labels.
func unlabelledCounter(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}
