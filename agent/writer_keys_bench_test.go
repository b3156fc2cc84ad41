package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

// benchCluster is a decode rank with two tensor-parallel prefill ranks,
// each agent on its own TCP plugin process.
type benchCluster struct {
	d    *Decode
	pre  []*Prefill
	room uint64
	// initSum is the time decode's Init took, summed over requests.
	initSum time.Duration
}

func startBenchCluster(b *testing.B, unbound bool) *benchCluster {
	return startBenchClusterWith(b, func(c *DecodeConfig) { c.UnboundKeys = unbound })
}

// startBenchClusterWith starts a cluster whose decode config tweak adjusts.
func startBenchClusterWith(b *testing.B, tweak func(*DecodeConfig)) *benchCluster {
	b.Helper()
	ctx := context.Background()
	open := func() sdk.Transport {
		p, err := sdk.Open(pluginBin, sdk.OpenOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = p.Close() })
		return p.Transport()
	}
	const shard = 16 << 10
	cfg := DecodeConfig{Rank: 0, Slots: 64, ShardBytes: shard, Shards: 2, Lease: 2 * time.Second,
		MaxHold: 10 * time.Second, Fence: true, ControlAddr: "127.0.0.1:0"}
	tweak(&cfg)
	d, err := NewDecode(ctx, cfg, open())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Close)
	c := &benchCluster{d: d}
	for rank := core.RankID(1); rank <= 2; rank++ {
		p, err := NewPrefill(ctx, PrefillConfig{Rank: rank, DecodeAddr: d.Addr(), SourcePages: 64, ShardBytes: shard, Lanes: 1,
			MaxInflight: 64, MaxBatchPages: 4, Heartbeat: 100 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
			RequestTombstone: 5 * time.Second, BootstrapTimeout: 5 * time.Second}, open())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		for deadline := time.Now().Add(10 * time.Second); !p.Linked(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("prefill never linked")
			}
		}
		c.pre = append(c.pre, p)
	}
	return c
}

// request moves one request of pages pages through both ranks and waits
// until decode has its slots back.
func (c *benchCluster) request(pages int) error {
	c.room++
	key := core.RequestKey{Room: c.room, Gen: 1}
	rv := c.d.NewReceiver(key)
	start := time.Now()
	if err := c.init(rv, pages); err != nil { // direct_layers_bench_test.go
		return err
	}
	c.initSum += time.Since(start)
	var senders []*KVSender
	for _, p := range c.pre {
		s := p.NewSender(key)
		if err := s.Init(pages); err != nil {
			return err
		}
		for i := 0; i < pages; i++ {
			if err := s.Send(i + 1); err != nil {
				return err
			}
		}
		if err := s.Finish(pages); err != nil {
			return err
		}
		senders = append(senders, s)
	}
	select {
	case <-rv.Done():
	case <-time.After(10 * time.Second):
		return fmt.Errorf("request %d never finished", c.room)
	}
	if rv.Poll() != PollSuccess {
		return fmt.Errorf("request %d: %v (%v)", c.room, rv.Poll(), rv.Err())
	}
	rv.Finish()
	for _, s := range senders {
		<-s.Done()
		s.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); !rv.Released(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("request %d: slots never came back", c.room)
		}
	}
	return nil
}

// BenchmarkWriterBoundKeys is the cost of binding each rank's keys to its
// data identity (issue 15, item 3): requests of 8 pages through a decode
// rank and two prefill ranks (TCP plugin processes), alternating between a
// cluster granting bound keys and one granting unbound keys, so both are
// measured in the same run under the same load. Reports each side's
// requests per second and bound/unbound.
//
//	go test ./agent/ -run '^$' -bench BenchmarkWriterBoundKeys -benchtime 200x
func BenchmarkWriterBoundKeys(b *testing.B) {
	bound, unbound := startBenchCluster(b, false), startBenchCluster(b, true)
	// Warm both: the first request of a rank opens its data connection,
	// before which its keys cannot be bound.
	for _, c := range []*benchCluster{bound, unbound} {
		if err := c.request(8); err != nil {
			b.Fatal(err)
		}
	}
	var tBound, tUnbound time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, arm := range []struct {
			c   *benchCluster
			sum *time.Duration
		}{{bound, &tBound}, {unbound, &tUnbound}} {
			start := time.Now()
			if err := arm.c.request(8); err != nil {
				b.Fatal(err)
			}
			*arm.sum += time.Since(start)
		}
	}
	b.StopTimer()
	if st := bound.d.Stats(); st.BoundGrants < 2*b.N {
		b.Fatalf("the bound cluster granted %d bound key sets for %d requests of 2 ranks", st.BoundGrants, b.N)
	}
	if st := unbound.d.Stats(); st.BoundGrants != 0 {
		b.Fatalf("the unbound cluster granted %d bound key sets", st.BoundGrants)
	}
	b.ReportMetric(float64(b.N)/tBound.Seconds(), "bound-req/s")
	b.ReportMetric(float64(b.N)/tUnbound.Seconds(), "unbound-req/s")
	b.ReportMetric(tUnbound.Seconds()/tBound.Seconds(), "bound/unbound-throughput")
}
