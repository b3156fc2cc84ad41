package tcp

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// The data port under a flood (issue 19): while one attacker holds the
// port — 1,100 strangers with their own certificates saying HELLO under
// guessed keys, 1,100 connections that never start a handshake, and 100
// connections of one identity that holds a real (stolen) key and writes
// under it to keep its sessions — an honest writer's every request is served. The receiver is a
// plugin process; the honest writer opens a fresh session per request (a
// new peer) and, as any client of a flooded port must, retries a dial that
// was reset. The known-unsafe admit-any receiver (the old data port) is
// caught: the strangers hold every slot and honest requests fail.

const (
	floodStrangers = 1100
	floodSilent    = 1100
	floodValid     = 100
	honestRequests = 8
	honestTries    = 10
)

func TestDataPortFloodLeavesHonestServed(t *testing.T) {
	// Thousands of TLS handshakes against the port: minutes under -race.
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	res := runDataFlood(t, pluginBin, nil)
	t.Logf("safe: honest %d/%d served; p50 quiet %v, flooded %v (ratio %.2f); valid flooder saw at most %d sessions at once",
		res.served, honestRequests, res.quietP50, res.floodP50, float64(res.floodP50)/float64(res.quietP50), res.validMax)
	t.Logf("safe: receiver stats: %v", res.stats)
	if res.served != honestRequests {
		t.Fatalf("only %d of %d honest requests served under the flood", res.served, honestRequests)
	}
	if m := res.stats[statMostSessionsPerWriter]; m > 64 {
		t.Fatalf("one identity held %d sessions at once, cap 64", m)
	}
	if res.stats[statHelloRefused] == 0 || res.stats[statSessionsCapped] == 0 || res.stats[statSilentEvicted] == 0 {
		t.Fatalf("the flood was not refused: %v", res.stats)
	}
}

func TestDataPortFloodCatchesAdmitAny(t *testing.T) {
	// The control arm of the same flood.
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	res := runDataFlood(t, unsafePluginBin, []string{"KVFENCE_TCP_UNSAFE=admit-any"})
	t.Logf("admit-any: honest %d/%d served; stats %v", res.served, honestRequests, res.stats)
	if res.served == honestRequests {
		t.Fatalf("the admit-any data port served every honest request: the flood test cannot fail")
	}
}

type floodResult struct {
	served             int
	quietP50, floodP50 time.Duration
	validMax           int64
	stats              map[string]uint64
}

func runDataFlood(t *testing.T, bin string, env []string) floodResult {
	env = append(env, "KVFENCE_TCP_HANDSHAKE_TIMEOUT=10s", "KVFENCE_TCP_FIRST_WRITE_TIMEOUT=5s")
	rp := sdktest.Subprocess(t, bin, sdk.OpenOptions{Env: env})
	s := newTCP(t, Config{AckTimeout: time.Minute, WriteTTL: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e, err := sdktest.NewEnv(ctx, sdktest.Pair{Sender: s, Receiver: rp.Transport()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ep, err := rp.Transport().LocalEndpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	honestKey := grantAll(t, e)
	stolen := grantAll(t, e) // the key the valid flooder holds
	var res floodResult
	quiet := honestRun(t, e, ep, honestKey)
	a := startFlood(t, ep.Address, stolen)
	defer a.stop()
	a.waitEstablished(t)
	flooded := honestRun(t, e, ep, honestKey)
	res.served = len(flooded)
	res.quietP50, res.floodP50 = p50(quiet), p50(flooded)
	res.validMax = a.validMax.Load()
	res.stats, _ = rp.Transport().(sdk.StatsReporter).Stats(ctx)
	return res
}

// honestRun makes honestRequests requests, each on a fresh peer (a new
// data session), and returns the latency of each one served; it stops at
// the first one not served.
func honestRun(t *testing.T, e *sdktest.Env, ep sdk.Endpoint, key sdk.Key) []time.Duration {
	var lat []time.Duration
	for i := range honestRequests {
		start := time.Now()
		if !honestRequest(t, e, ep, key, uint64(i)*4096) {
			break // one unserved request decides both arms
		}
		lat = append(lat, time.Since(start))
	}
	return lat
}

// honestRequest writes 4 KiB on a new peer, retrying a dial the flood
// reset (quiescing a write left in doubt first); true once it Succeeded.
func honestRequest(t *testing.T, e *sdktest.Env, ep sdk.Endpoint, key sdk.Key, off uint64) bool {
	ctx := context.Background()
	for try := 0; try < honestTries; try++ {
		peer, err := e.Sender.Connect(ctx, ep)
		if err != nil {
			t.Fatal(err)
		}
		b := e.Write(e.NewBatchID(), key, off, off, 4096)
		b.Peer = peer
		if err := e.Sender.Post(ctx, b); err != nil {
			t.Fatal(err)
		}
		c, err := e.Wait(b.ID)
		if err != nil {
			// A starved data port can leave the batch unanswered past the
			// wait (the sender's ack timeout is a minute): not served.
			t.Logf("honest try %d: %v", try, err)
			_ = e.Sender.Disconnect(ctx, peer)
			return false
		}
		if c.Status == sdk.InDoubt {
			qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, _ = e.Sender.Quiesce(qctx, peer, []sdk.BatchID{b.ID})
			cancel()
		}
		_ = e.Sender.Disconnect(ctx, peer)
		if c.Status == sdk.Succeeded {
			return true
		}
		t.Logf("honest try %d: %v %v %s", try, c.Status, c.Class, c.Detail)
		time.Sleep(time.Second)
	}
	return false
}

func p50(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// flood is the attacker's goroutines and what they achieved.
type flood struct {
	quit      chan struct{}
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	attempts  atomic.Int64
	validLive atomic.Int64
	validMax  atomic.Int64
}

func startFlood(t *testing.T, addr string, stolen sdk.Key) *flood {
	hostPort, pin, _, err := splitPin(addr)
	if err != nil {
		t.Fatal(err)
	}
	a := &flood{quit: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	valid := newTestIdentity(t)
	for range floodStrangers {
		id := newTestIdentity(t)
		a.loop(2*time.Second, func() { a.hello(hostPort, pin, id, sdk.Key(randomNonZero()), nil) })
	}
	for range floodSilent {
		a.loop(time.Second, func() { a.silent(hostPort) })
	}
	for range floodValid {
		a.loop(time.Second, func() { a.hello(hostPort, pin, valid, stolen, &a.validLive) })
	}
	return a
}

// loop runs attempt until stopped, pausing between attempts.
func (a *flood) loop(pause time.Duration, attempt func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			attempt()
			select {
			case <-a.quit:
				return
			case <-time.After(pause):
			}
		}
	}()
}

// track remembers c so stop can close it; false when stopping.
func (a *flood) track(c net.Conn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.quit:
		_ = c.Close()
		return false
	default:
	}
	a.conns[c] = struct{}{}
	return true
}

func (a *flood) untrack(c net.Conn) {
	a.mu.Lock()
	delete(a.conns, c)
	a.mu.Unlock()
	_ = c.Close()
}

// silent connects and says nothing until the receiver closes it.
func (a *flood) silent(hostPort string) {
	c, err := net.DialTimeout("tcp", hostPort, 10*time.Second)
	a.attempts.Add(1)
	if err != nil || !a.track(c) {
		return
	}
	defer a.untrack(c)
	_, _ = io.Copy(io.Discard, c)
}

// hello handshakes as id, says HELLO naming key and, if a session opens,
// holds it until the receiver closes it. live (the valid flooder) counts
// the sessions open at once; those write one byte first, so that they are
// writers the receiver may not evict and hold their sessions for good.
func (a *flood) hello(hostPort string, pin fingerprint, id *identity, key sdk.Key, live *atomic.Int64) {
	settled := sync.OnceFunc(func() { a.attempts.Add(1) })
	defer settled()
	raw, err := net.DialTimeout("tcp", hostPort, 10*time.Second)
	if err != nil || !a.track(raw) {
		return
	}
	defer a.untrack(raw)
	c := tls.Client(raw, id.clientTLS(pin))
	_ = raw.SetDeadline(time.Now().Add(20 * time.Second))
	var hb [headerSize]byte
	(&header{Type: frameHello, Key: uint64(key)}).encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		return
	}
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return
	}
	if h, err := decodeHeader(hb[:], 0); err != nil || h.Code != 0 {
		return
	}
	settled()
	if live != nil {
		(&header{Type: frameWrite, Code: writeAckNow, Seq: 1, Key: uint64(key), Offset: sdktest.EnvSize - 1, Length: 1, Deadline: time.Now().Add(time.Minute).UnixNano()}).encode(hb[:])
		if _, err := c.Write(append(hb[:], 0xEE)); err != nil {
			return
		}
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return
		}
	}
	_ = raw.SetDeadline(time.Time{})
	if live != nil {
		n := live.Add(1)
		defer live.Add(-1)
		for m := a.validMax.Load(); n > m && !a.validMax.CompareAndSwap(m, n); m = a.validMax.Load() {
		}
	}
	_, _ = io.Copy(io.Discard, c)
}

// waitEstablished returns once every attacker's first attempt was dealt
// with (connected, refused, or holding a session), waiting per step.
func (a *flood) waitEstablished(t *testing.T) {
	const all = floodStrangers + floodSilent + floodValid
	last, progress := int64(-1), time.Now()
	for a.attempts.Load() < all {
		if n := a.attempts.Load(); n != last {
			last, progress = n, time.Now()
		} else if time.Since(progress) > 2*time.Minute {
			t.Fatalf("the flood stalled at %d of %d first attempts", n, all)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
}

func (a *flood) stop() {
	a.mu.Lock()
	close(a.quit)
	for c := range a.conns {
		_ = c.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
}
