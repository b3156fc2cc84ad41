//go:build kvfenceunsafe

package gpumem

import (
	"time"

	"github.com/kvfence/kvfence/agent"
)

// CopiesBeforeSuccess: this is the known-unsafe control arm. Its receiver
// copies the slots into the engine's GPU pages while writes still land
// (as a design that streams landed pages to the GPU would), and its
// Abort says the GPU pages are free while those copies may still run. The test of the
// staged promise must catch it.
const CopiesBeforeSuccess = true

func startEarlyCopies(r *StagedReceiver) {
	go func() {
		// Until the agent gives the slots back: held slots of an aborted
		// request are still streamed, so its late writes follow.
		for !r.rv.Released() {
			time.Sleep(time.Millisecond)
			slots := agent.UnsafeSlots(r.rv)
			if len(slots) == 0 {
				return // released, or handed off (the safe path copies it)
			}
			ps, err := pieces(r.bufs, r.idx, func(i int) []byte { return slots[i] })
			if err != nil {
				return
			}
			if op, err := r.mv.Scatter(ps); err == nil {
				_ = op.Wait()
			}
		}
	}()
}

// freesAtAbort: the known-unsafe control arm of direct mode. Its
// DirectReceiver gives the engine pages back at Abort, while the exposure
// (the NIC's permission to write them) is still open and writes may be in
// flight; the hold test must catch it.
const freesAtAbort = true
