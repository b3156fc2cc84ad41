package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

// This file: writer-bound keys (issue 15). A key of an exposure has one
// writer per shard position, so with a transport that declares
// Capabilities.WriterBound decode grants each rank its own keys, bound to
// the data identity the rank announced in its Hello (peerHello.Writer):
// a key that leaks to, or is misused by, another rank is refused by the
// receiving device itself. A rank whose identity is unknown (its link is
// down, it announced none) or not connected to our transport yet (the TCP
// plugin dials on a rank's first write) gets the exposure's unbound keys,
// as every rank did before.
//
// The cost beyond the extra Grants: a bound key lives as long as its
// writer stays connected (tcp: while any of the rank's data sessions here
// is open). A Quiesce that has to end a rank's only session (batches in
// doubt) also ends the keys of that rank's other requests, whose later
// writes are then refused and which fail — safely; unbound keys would have
// carried on over a new connection. Ranks with several lanes keep their
// identity present while any lane is connected.

// slotRun is pages first..first+n-1 of an exposure, in consecutive slots.
type slotRun struct{ first, n int }

// slotRuns splits an exposure's slots into runs: the pool hands out runs,
// so an admission costs a few Grants, not one per page.
func slotRuns(slots []uint32) []slotRun {
	var runs []slotRun
	for i := range slots {
		if k := len(runs) - 1; k >= 0 && slots[i] == slots[runs[k].first]+uint32(runs[k].n) {
			runs[k].n++
			continue
		}
		runs = append(runs, slotRun{first: i, n: 1})
	}
	return runs
}

// grantRuns grants one key per run for writer ("" = unbound), in parallel,
// and returns the per-page keys and every key granted (to revoke, even on
// error).
func (d *Decode) grantRuns(slots []uint32, writer string) ([]keyRef, []sdk.Key, error) {
	runs := slotRuns(slots)
	keys := make([]sdk.Key, len(runs))
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			keys[i], errs[i] = d.granter.Grant(ctx, sdk.Window{Region: d.region,
				Offset: uint64(int64(slots[r.first]) * d.slotB), Length: uint64(int64(r.n) * d.slotB), Writer: writer})
		}()
	}
	wg.Wait()
	refs := make([]keyRef, len(slots))
	var granted []sdk.Key
	for i, k := range keys {
		if errs[i] != nil {
			continue
		}
		granted = append(granted, k)
		for p := 0; p < runs[i].n; p++ {
			refs[runs[i].first+p] = keyRef{Key: uint64(k), Base: uint64(int64(p) * d.slotB)}
		}
	}
	return refs, granted, errors.Join(errs...)
}

// grantBound gives each rank of dt keys bound to its data identity, and
// the ranks that cannot have them the exposure's unbound keys (loop only).
func (d *Decode) grantBound(dt *decTag) error {
	dt.rankKeys = map[core.RankID][]keyRef{}
	needUnbound := false
	for _, rank := range dt.ranks {
		writer := ""
		if l := d.links[rank]; l != nil {
			writer = l.peer.Writer
		}
		if writer == "" {
			needUnbound = true
			continue
		}
		refs, granted, err := d.grantRuns(dt.slots, writer)
		dt.granted = append(dt.granted, granted...)
		switch {
		case err == nil:
			dt.rankKeys[rank] = refs
			d.stats.BoundGrants++
		case sdk.IsClass(err, sdk.ClassFailedPrecondition):
			// Not connected to our transport (yet, or any more): unbound.
			d.log.Debug("writer not connected: unbound keys for this rank", "tag", dt.tag, "rank", rank, "error", err)
			needUnbound = true
		default:
			return err
		}
	}
	if !needUnbound {
		return nil
	}
	d.stats.UnboundGrants++
	refs, granted, err := d.grantRuns(dt.slots, "")
	dt.keys = refs
	dt.granted = append(dt.granted, granted...)
	return err
}

// keysFor is what the Assign to rank carries.
func (dt *decTag) keysFor(rank core.RankID) []keyRef {
	if k, ok := dt.rankKeys[rank]; ok {
		return k
	}
	return dt.keys
}
