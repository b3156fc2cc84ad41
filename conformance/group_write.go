package conformance

import (
	"context"
	"fmt"

	"github.com/kvfence/kvfence/sdk"
)

func writeGroup() group {
	return group{name: "write-correctness", needs: needsGranter, checks: []check{
		{"sizes", PromiseSucceeded, checkSizes},
		{"scatter-list", PromiseSucceeded, checkScatter},
		{"whole-pool", PromiseSucceeded, checkWholePool},
	}}
}

// writeSizes are the single-op sizes checked, up to max: odd sizes and page
// edges catch off-by-one bugs, the largest catches partial application.
func writeSizes(max uint64) []uint64 {
	out := []uint64{1, 3, 4095, 4096, 4097, 65537, 1<<20 + 5}
	for _, s := range []uint64{4 << 20, 16 << 20, 64 << 20} {
		if s < max {
			out = append(out, s)
		}
	}
	if out[len(out)-1] > max {
		out = out[:len(out)-1]
	}
	return append(out, max)
}

// verifyWrite checks a Succeeded write at once: every byte of the window
// equals the source, the guard bytes around it still hold the sentinel.
// A Succeeded completion is a promise that the bytes are there NOW.
func verifyWrite(se *session, c sdk.Completion, dstOff, srcOff, n uint64, sentinel byte) error {
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("%d-byte write on a healthy link: %v (%s)", n, c.Status, c.Detail)
	}
	mem := se.dstAt(0, se.size)
	if err := mismatch(mem[dstOff:dstOff+n], se.src.Bytes()[srcOff:srcOff+n]); err != nil {
		return broke(PromiseSucceeded, fmt.Errorf("%d-byte write reported Succeeded, but the target does not hold the bytes yet: %w", n, err))
	}
	if c.BytesLanded != n {
		return fmt.Errorf("%d-byte write Succeeded with BytesLanded %d", n, c.BytesLanded)
	}
	lo := dstOff - min(dstOff, 4096)
	if err := untouched(mem[lo:dstOff], sentinel); err != nil {
		return fmt.Errorf("%d-byte write touched the bytes before its window: %w", n, err)
	}
	if hi := min(dstOff+n+4096, uint64(len(mem))); hi > dstOff+n {
		if err := untouched(mem[dstOff+n:hi], sentinel); err != nil {
			return fmt.Errorf("%d-byte write touched the bytes after its window: %w", n, err)
		}
	}
	return nil
}

func checkSizes(ctx context.Context, s *suite, r *Result) error {
	se := s.main
	max := min(s.cfg.MaxWriteSize, s.info.Capabilities.MaxOpBytes)
	for i, n := range writeSizes(max) {
		dstOff, srcOff := uint64(4096+13), uint64(7+i) // unaligned on both sides
		if dstOff+n+4096 > se.size || srcOff+n > se.size {
			dstOff, srcOff = 4096, 0
		}
		sentinel := byte(0xC0 + i)
		k, err := se.grant(ctx, dstOff, n, sentinel)
		if err != nil {
			return err
		}
		c, err := se.postWait(ctx, se.write(k, srcOff, 0, n))
		if err == nil {
			err = verifyWrite(se, c, dstOff, srcOff, n, sentinel)
		}
		_, _ = se.tgt.g.Revoke(ctx, k)
		if err != nil {
			return err
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("sizes %v verified byte by byte", writeSizes(max)))
	return nil
}

// checkScatter: one batch of many odd-sized ops from scattered sources to
// scattered destinations (in reverse order) inside one window.
func checkScatter(ctx context.Context, s *suite, _ *Result) error {
	se := s.main
	const win, ops = 1 << 20, 64
	k, err := se.grant(ctx, 4096+1, win, 0x3D)
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	b := sdk.Batch{ID: se.id(), Peer: se.peer}
	type span struct{ src, dst, n uint64 }
	var spans []span
	for i := uint64(0); i < ops; i++ {
		n := i*37%3000 + 1
		dst := (ops-1-i)*(win/ops) + i%7 // reverse order, unaligned
		src := (i * 40961) % (se.size - 4096)
		spans = append(spans, span{src, dst, n})
		b.Ops = append(b.Ops, sdk.Op{Kind: sdk.OpWrite, LocalRegion: se.srcID, LocalOffset: src, RemoteKey: k, RemoteOffset: dst, Length: n})
	}
	c, err := se.postWait(ctx, b)
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("scatter batch on a healthy link: %v (%s)", c.Status, c.Detail)
	}
	mem := se.dstAt(4096+1, se.size)
	covered := make([]bool, win)
	for i, sp := range spans {
		if err := mismatch(mem[sp.dst:sp.dst+sp.n], se.src.Bytes()[sp.src:sp.src+sp.n]); err != nil {
			return fmt.Errorf("scatter op %d ([%d,+%d)): Succeeded but %w", i, sp.dst, sp.n, err)
		}
		for j := sp.dst; j < sp.dst+sp.n; j++ {
			covered[j] = true
		}
	}
	for j := uint64(0); j < win; j++ {
		if !covered[j] && mem[j] != 0x3D {
			return fmt.Errorf("scatter batch wrote byte %d of its window, which no op covers", j)
		}
	}
	return nil
}

// checkWholePool: the whole destination region as one window, filled by one
// batch of MaxOpBytes-bounded ops.
func checkWholePool(ctx context.Context, s *suite, _ *Result) error {
	se := s.main
	n := se.size
	chunk := min(s.info.Capabilities.MaxOpBytes, 1<<20)
	if n/chunk+1 > uint64(s.info.Capabilities.MaxBatch) {
		chunk = n/uint64(s.info.Capabilities.MaxBatch) + 1
	}
	se.fillDst(0, se.size, 0x4E)
	k, err := se.tgt.g.Grant(ctx, sdk.Window{Region: se.dstID, Length: n})
	if err != nil {
		return err
	}
	defer se.tgt.g.Revoke(ctx, k)
	c, err := se.postWait(ctx, se.split(k, 0, 0, n, chunk))
	if err != nil {
		return err
	}
	if c.Status != sdk.Succeeded {
		return fmt.Errorf("whole-pool batch on a healthy link: %v (%s)", c.Status, c.Detail)
	}
	if err := mismatch(se.dstAt(0, se.size), se.src.Bytes()); err != nil {
		return fmt.Errorf("whole pool reported Succeeded, but %w", err)
	}
	return nil
}
