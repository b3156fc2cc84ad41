package core

// ReceiverMetrics are the figures of one decode rank. Counters only grow;
// the *Slots and HeldBytes fields are gauges.
type ReceiverMetrics struct {
	Admitted uint64
	Handoffs uint64
	Aborts   uint64 // exposures that left Assigned other than by handoff (not rejects)
	Rejects  uint64
	// Released counts releases by path (index with PathDrained, ...). The
	// restart quarantine counts as one release of its path.
	Released [numPaths]uint64

	StaleMessages   uint64 // old generation or instance: ignored (I4)
	ForeignMessages uint64 // from a rank the assignment does not name, or misaddressed
	ShortCoverage   uint64 // commits that covered fewer pages than assigned
	PeerDeaths      uint64
	Grants          uint64 // rank leases granted (Lease answers with a lease)
	Resyncs         uint64 // heartbeat sessions reset: a full list asked for
	TargetRestarts  uint64 // restarts of a target plugin instance asked for (restart fence)
	RestartFailed   uint64 // live exposures a restart failed: its blast radius
	// RevokesAfterDrain: aborts EagerRevoke left to revoke after the drain
	// because a rank writing them does not isolate refused writes.
	RevokesAfterDrain uint64

	AssignedSlots    int // exposed, being written
	HeldSlots        int // aborting: held until drained, fenced or timeout
	HandedSlots      int // owned by the decode loop
	QuarantinedSlots int // held after a restart
	HeldBytes        int64
	SlotBytes        int64
}

// SenderMetrics are the figures of one prefill rank.
type SenderMetrics struct {
	Posted         uint64 // batches
	Succeeded      uint64
	FailedDefinite uint64
	InDoubt        uint64
	Quiesced       uint64 // batches covered by quiescence evidence
	Commits        uint64
	Fails          uint64
	DrainAcks      uint64
	Heartbeats     uint64
	RankLeases     uint64 // Lease answers that granted a rank lease

	DuplicateAssigns uint64 // ignored: a stream or tombstone exists
	RefusedAssigns   uint64 // lease already lapsed, or the request was already ended here
	LeaseLapses      uint64 // streams that stopped because the lease ran out
	DroppedPages     uint64 // unsent pages dropped by an abort
	StaleMessages    uint64

	Unsettled  int // batches that may still move bytes
	Streams    int // live streams
	Tombstones int
	Requests   int
}
