package agent

import (
	"context"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

// A prefill rank's data lanes outlive their use: a lane to a target
// instance decode replaced, or to a decode data endpoint that moved, is
// retired. It is disconnected — so the plugin forgets the peer — only once
// no unsettled batch rides on it: Quiesce works per peer, and a batch in
// doubt on a peer already forgotten could never get evidence (its source
// pages would stay held for ever).

// lanesBook counts the unsettled batches per lane and keeps the retired
// lanes that still carry some (prefill loop only).
type lanesBook struct {
	perPeer map[sdk.PeerID]int
	retired map[sdk.PeerID]bool
}

// track records that batch id rides on peer (until untrack).
func (p *Prefill) track(id core.BatchID, peer sdk.PeerID) {
	if p.perPeer == nil {
		p.perPeer, p.retired = map[sdk.PeerID]int{}, map[sdk.PeerID]bool{}
	}
	p.batchPeer[id] = peer
	p.perPeer[peer]++
}

// untrack forgets a settled (or never accepted) batch; a retired lane
// that carried the last one is disconnected.
func (p *Prefill) untrack(id core.BatchID) {
	peer, ok := p.batchPeer[id]
	if !ok {
		return
	}
	delete(p.batchPeer, id)
	if p.perPeer[peer]--; p.perPeer[peer] > 0 {
		return
	}
	delete(p.perPeer, peer)
	if p.retired[peer] {
		delete(p.retired, peer)
		p.disconnect(peer)
	}
}

// adoptLane: a lane Connect returned is in use (a plugin that keys peers
// by address may hand back a retired one).
func (p *Prefill) adoptLane(peer sdk.PeerID) { delete(p.retired, peer) }

// dropLanes retires lanes that lead nowhere any more (a replaced or
// dropped target instance, a decode whose data endpoint moved): those with
// no unsettled batch are disconnected now, the others once it settles.
func (p *Prefill) dropLanes(ids []sdk.PeerID) {
	if p.retired == nil {
		p.perPeer, p.retired = map[sdk.PeerID]int{}, map[sdk.PeerID]bool{}
	}
	done := map[sdk.PeerID]bool{} // lanes can share a peer: retire it once
	for _, id := range ids {
		if done[id] {
			continue
		}
		done[id] = true
		if p.perPeer[id] > 0 {
			p.retired[id] = true
		} else {
			p.disconnect(id)
		}
	}
}

func (p *Prefill) disconnect(peer sdk.PeerID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := p.tr.Disconnect(ctx, peer); err != nil {
		p.log.Warn("disconnect a retired data lane", "peer", peer, "error", err)
	}
}
