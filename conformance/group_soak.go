package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// soakGroup keeps one plugin process busy long enough that behaviour which
// changes with its age or load shows: thousands of batches of mixed sizes
// and concurrency, every Succeeded checked against target memory as it
// arrives (verify.go). Every profile requires it.
func soakGroup() group {
	return group{name: "soak", needs: needsGranter, checks: []check{
		{"mixed-load", PromiseSucceeded, checkSoak},
	}}
}

// The soak's shape: ops of 4–512 KiB, 1–8 ops a batch, 1–8 batches in
// flight (the depth changes every soakPhase batches).
const (
	soakMinOp    = 4 << 10
	soakMaxOp    = 512 << 10
	soakMaxOps   = 8
	soakMaxDepth = 8
	soakPhase    = 64
	soakSlot     = soakMaxOps * soakMaxOp // one in-flight batch's target bytes
)

// soakRun is the soak's state: a fresh pair, one key over soakMaxDepth
// slots of target memory, each slot owned by at most one batch in flight.
type soakRun struct {
	s      *suite
	se     *session
	key    sdk.Key
	rng    *rand.Rand
	free   []uint64 // free slot offsets
	queue  []soakBatch
	maxOps int
	maxOp  uint64
	bytes  uint64
}

type soakBatch struct {
	id   sdk.BatchID
	slot uint64
}

func checkSoak(ctx context.Context, s *suite, r *Result) error {
	se, err := s.newSessionSized(ctx, false, soakMaxDepth*soakSlot+1<<20)
	if err != nil {
		return err
	}
	defer se.close()
	k, err := se.grant(ctx, 0, soakMaxDepth*soakSlot, 0)
	if err != nil {
		return err
	}
	seed := uint64(time.Now().UnixNano())
	run := &soakRun{s: s, se: se, key: k, rng: rand.New(rand.NewPCG(seed, 23)),
		maxOps: soakMaxOps, maxOp: min(soakMaxOp, s.cfg.MaxWriteSize)}
	if c := s.info.Capabilities; c.MaxBatch > 0 {
		run.maxOps = min(run.maxOps, c.MaxBatch)
	}
	if c := s.info.Capabilities; c.MaxOpBytes > 0 {
		run.maxOp = min(run.maxOp, c.MaxOpBytes)
	}
	for i := uint64(0); i < soakMaxDepth; i++ {
		run.free = append(run.free, i*soakSlot)
	}
	_, checked0 := s.succeededCounts()
	start := time.Now()
	n, err := run.loop(ctx)
	if err != nil {
		return fmt.Errorf("soak batch %d of %d (seed %d): %w", n, s.cfg.SoakBatches, seed, err)
	}
	secs := time.Since(start).Seconds()
	_, checked1 := s.succeededCounts()
	r.Metrics = map[string]float64{"batches": float64(n), "bytes": float64(run.bytes), "seconds": secs,
		"succeeded_checked": float64(checked1 - checked0)}
	r.Notes = append(r.Notes, fmt.Sprintf("soak: %d batches, %d MiB in %.1fs on one plugin pair (ops 4–512 KiB, 1–%d a batch, 1–%d in flight; seed %d); %d Succeeded compared byte for byte with target memory",
		n, run.bytes>>20, secs, run.maxOps, soakMaxDepth, seed, checked1-checked0))
	s.report.Soak = &SoakInfo{Batches: n, Bytes: run.bytes, Duration: time.Since(start).Round(time.Millisecond).String(),
		MinBatches: s.cfg.SoakBatches, MinDuration: s.cfg.SoakFor.String()}
	return nil
}

// loop posts until both SoakBatches batches and SoakFor have passed, then
// drains; it returns how many batches were posted.
func (run *soakRun) loop(ctx context.Context) (int, error) {
	cfg := run.s.cfg
	start := time.Now()
	depth := 1
	n := 0
	for ; n < cfg.SoakBatches || time.Since(start) < cfg.SoakFor; n++ {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if n%soakPhase == 0 {
			depth = 1 + run.rng.IntN(soakMaxDepth)
		}
		for len(run.queue) >= depth || len(run.free) == 0 {
			if err := run.reap(); err != nil {
				return n, err
			}
		}
		if err := run.post(ctx); err != nil {
			return n, err
		}
	}
	for len(run.queue) > 0 {
		if err := run.reap(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// post builds a batch of random ops into a free slot, poisons its target
// bytes (so that stale bytes from an earlier batch cannot pass for it) and
// posts it.
func (run *soakRun) post(ctx context.Context) error {
	se := run.se
	slot := run.free[len(run.free)-1]
	run.free = run.free[:len(run.free)-1]
	b := sdk.Batch{ID: se.id(), Peer: se.peer}
	at := slot
	for range 1 + run.rng.IntN(run.maxOps) {
		n := soakMinOp + run.rng.Uint64N(run.maxOp-soakMinOp+1)
		src := run.rng.Uint64N(se.size - n)
		se.fillDst(at, at+n, byte(0xA5^b.ID))
		b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: se.srcID, LocalOffset: src,
			RemoteKey: run.key, RemoteOffset: at, Length: n})
		at += n
		run.bytes += n
	}
	if err := se.ini.t.Post(ctx, b); err != nil {
		return fmt.Errorf("Post on a healthy link: %w", err)
	}
	run.queue = append(run.queue, soakBatch{b.ID, slot})
	return nil
}

// reap waits for the oldest batch in flight: on a healthy link it must
// succeed (its bytes were compared as its completion arrived).
func (run *soakRun) reap() error {
	q := run.queue[0]
	run.queue = run.queue[1:]
	c, err := run.se.wait(q.id, run.s.cfg.CompletionTimeout)
	if err != nil || c.Status != sdk.Succeeded {
		return healthy(fmt.Sprintf("soak batch %d", q.id), c, err)
	}
	run.free = append(run.free, q.slot)
	return nil
}
