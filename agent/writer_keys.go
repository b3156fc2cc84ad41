package agent

// This file: writer-bound keys (issue 15). A key of an exposure has one
// writer per shard position, so with a transport that declares
// Capabilities.WriterBound decode grants each rank its own keys, bound to
// the data identity the rank announced in its Hello (peerHello.Writer):
// a key that leaks to, or is misused by, another rank is refused by the
// receiving device itself. A rank not connected to our transport yet (the
// TCP plugin dials on a rank's first write) gets keys of its own that are
// not writer-bound but still cover only its shards (shard_keys.go); a
// rank that announces no identity gets no keys at all.
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
