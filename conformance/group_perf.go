package conformance

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// perfGroup records a performance profile as information: it never fails a
// plugin for being slow (only for failing to move bytes at all).
func perfGroup() group {
	return group{name: "performance", needs: needsGranter, checks: []check{
		{"profile", PromiseInfoOnly, checkPerf},
	}}
}

func checkPerf(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	// Directly to the target, not through the proxy: the profile is of the
	// plugin on the link, not of the fault injector.
	peer := se.peer
	if se.proxy != nil {
		ep, err := se.tgt.t.LocalEndpoint(ctx)
		if err != nil {
			return err
		}
		if peer, err = se.ini.t.Connect(ctx, ep); err != nil {
			return err
		}
		defer se.ini.t.Disconnect(ctx, peer)
	}
	const win = 4 << 20
	k, err := se.grant(ctx, 0, win, 0)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	m := map[string]float64{}
	// Bandwidth: 1 MiB ops, 4 per batch, 4 batches in flight.
	const op, perBatch, inflight = 1 << 20, 4, 4
	total := max(s.cfg.PerfBytes/(op*perBatch), 1)
	start := time.Now()
	var queue []sdk.BatchID
	for i := uint64(0); i < total; i++ {
		b := se.split(k, srcShift(int(i)), 0, op*perBatch, op)
		b.Peer = peer
		if err := se.ini.t.Post(ctx, b); err != nil {
			return err
		}
		queue = append(queue, b.ID)
		if len(queue) >= inflight {
			if c, err := se.wait(queue[0], s.cfg.CompletionTimeout); err != nil || c.Status != sdk.Succeeded {
				return healthy("bandwidth batch", c, err)
			}
			queue = queue[1:]
		}
	}
	for _, id := range queue {
		if _, err := se.wait(id, s.cfg.CompletionTimeout); err != nil {
			return err
		}
	}
	secs := time.Since(start).Seconds()
	m["bandwidth_mib_s"] = float64(total*op*perBatch) / (1 << 20) / secs
	// Latency: one 4 KiB op per batch, one at a time.
	var postLat, compLat []float64
	for i := 0; i < 200; i++ {
		b := se.write(k, srcShift(i+1), 0, 4096)
		b.Peer = peer
		t0 := time.Now()
		if err := se.ini.t.Post(ctx, b); err != nil {
			return err
		}
		t1 := time.Now()
		if _, err := se.wait(b.ID, s.cfg.CompletionTimeout); err != nil {
			return err
		}
		postLat = append(postLat, float64(t1.Sub(t0).Microseconds()))
		compLat = append(compLat, float64(time.Since(t0).Microseconds()))
	}
	m["post_call_p50_us"], m["post_call_p99_us"] = pct(postLat, 50), pct(postLat, 99)
	m["completion_p50_us"], m["completion_p99_us"] = pct(compLat, 50), pct(compLat, 99)
	r.Metrics = m
	r.Notes = append(r.Notes, fmt.Sprintf("bandwidth %.0f MiB/s (%d MiB, 1 MiB ops, %d in flight); Post call p50 %.0f µs; post-to-completion p50 %.0f µs p99 %.0f µs (4 KiB, 1 op/batch)",
		m["bandwidth_mib_s"], total*op*perBatch>>20, inflight, m["post_call_p50_us"], m["completion_p50_us"], m["completion_p99_us"]))
	return nil
}

// srcShift is the source offset of the i-th write to the same target
// bytes: shifting the source pattern by 4096 changes every byte, so
// consecutive writes differ and a Succeeded whose bytes have not landed
// cannot pass its check on the previous write's bytes (verify.go).
func srcShift(i int) uint64 { return uint64(i%31) * 4096 }

func pct(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}
