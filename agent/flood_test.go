package agent

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/oracle"
)

// Finding 6 (issue 15): a heartbeat naming 65,536 unknown tags, sent in a
// loop, took decode to 3.7 GB and 20 s stalls. Here an authenticated peer
// (mutual TLS, prefill rank 2's certificate) floods decode with such heartbeats and with
// heartbeats just under the tag bound, as fast as it can, reconnecting
// whenever decode cuts it off; meanwhile honest rank 1 runs requests.
// Decode's heap must stay bounded and every honest request must succeed.
func TestFloodingPeerCostsBoundedMemory(t *testing.T) {
	load := testPKI(t) // mutual TLS: the flooder holds prefill rank 2's valid certificate
	d, p := startPair(t, func(c *DecodeConfig) { c.Shards = 2; c.TLS = load("decode-0") },
		func(c *PrefillConfig) { c.TLS = load("prefill-1") }, nil)
	floodTLS := load("prefill-2")
	hello := peerHello{Role: RolePrefill, Rank: 2, ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}}
	huge := heartbeatFrame(2, 1<<16)                  // finding 6: 65,536 tags no rank of a 16-slot pool can hold
	wide := heartbeatFrame(2, maxHeartbeatTags(16)-1) // the most an honest rank may name; all unknown

	runtime.GC()
	base := heapInUse()
	ctx, stop := context.WithCancel(context.Background())
	var sent atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				l, _, err := dial(dctx, d.Addr(), floodTLS, identity{RoleDecode, 0}, hello)
				cancel()
				if err != nil {
					continue
				}
				// Decode's backpressure stalls SendMsg; closing the link ends it.
				unblock := context.AfterFunc(ctx, l.close)
				for i := 0; ctx.Err() == nil; i++ {
					f := wide
					if w == 0 && i%4 == 0 {
						f = huge
					}
					// Straight onto the stream: the flooder does not queue.
					if l.s.SendMsg(&frame{Type: frameCore, Seq: uint64(i) + 2, Core: f}) != nil {
						break
					}
					sent.Add(1)
				}
				unblock()
				l.close()
			}
		}()
	}
	var peak atomic.Uint64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			if h := heapInUse(); h > peak.Load() {
				peak.Store(h)
			}
			if peak.Load() > base+1<<30 {
				stop() // the unbounded decode: stop before the machine runs out
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	// Honest rank 1 is served throughout.
	for room := uint64(1); room <= 20 && ctx.Err() == nil; room++ {
		if err := honestRequest(t, d, p, core.RequestKey{Room: room, Gen: 1}, 3); err != nil {
			stop()
			wg.Wait()
			t.Fatalf("honest request %d during the flood: %v", room, err)
		}
	}
	time.Sleep(time.Second) // let the flood run on its own too
	stop()
	wg.Wait()
	<-sampled
	growth := int64(peak.Load()) - int64(base)
	t.Logf("flood: %d frames sent; decode process heap grew by at most %.1f MiB", sent.Load(), float64(growth)/(1<<20))
	if growth > 128<<20 {
		t.Fatalf("heap grew by %.0f MiB under the flood; want it bounded (< 128 MiB)", float64(growth)/(1<<20))
	}
	if plainCounter(t, d.Metrics, "kvfence_stale_messages_total") == 0 {
		t.Fatal("no heartbeat's unknown tags reached the core: the flood did not reach the loop")
	}
	if st := d.Stats(); st.CorruptPages != 0 {
		t.Fatalf("%d corrupt pages", st.CorruptPages)
	}
}

// heartbeatFrame is a full heartbeat from rank listing n tags decode never
// assigned, with a matching count and digest: decode resets its copy of
// the rank's list, takes every tag in, and answers with Aborts (bounded
// by core.MaxStaleAborts) and a Lease that excludes them all.
func heartbeatFrame(rank core.RankID, n int) []byte {
	m := core.Message{Kind: core.KindHeartbeat, Rank: rank, Decode: 0, Session: 7, Seq: 1, Full: true, Count: uint32(n)}
	for i := 0; i < n; i++ {
		m.Tags = append(m.Tags, core.Tag{Instance: 1, Room: uint64(i), Gen: 1})
		m.Digest += core.TagHash(m.Tags[i])
	}
	return core.AppendMessage(nil, &m)
}

// plainCounter is the value of a counter without labels.
func plainCounter(t testing.TB, m *Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// honestRequest runs one request of pages pages written by rank 1 through
// the engine API and gives its memory back.
func honestRequest(t *testing.T, d *Decode, p *Prefill, key core.RequestKey, pages int) error {
	t.Helper()
	rv := d.NewReceiver(key)
	if _, err := rv.Init(pages, []core.RankID{1}); err != nil {
		return err
	}
	snd := p.NewSender(key)
	if err := snd.Init(pages); err != nil {
		return err
	}
	for i := 0; i < pages; i++ {
		oracle.FillShard(snd.Page(i), oracle.PageIdentity{Room: key.Room, Gen: key.Gen, Page: uint32(i), Rank: 1})
		if err := snd.Send(i + 1); err != nil {
			return err
		}
	}
	if err := snd.Finish(pages); err != nil {
		return err
	}
	select {
	case <-rv.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("request %v never finished", key)
	}
	if err := rv.Err(); err != nil {
		return err
	}
	rv.Finish()
	<-snd.Done()
	snd.Close()
	return snd.Err()
}
