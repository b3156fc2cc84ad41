package tcp

import "time"

// A revoked key stays known for a while, so that the writes still arriving
// under it are refused as revoked (FailedPrecondition at their sender) and
// counted in its RevokeResult; after revokedRetention it is forgotten and
// later writes under it are refused as unknown (nothing applies either
// way). Without this, a receiver that grants a key per request (the kvfence
// decode agent with fencing) would keep every key it ever granted.

// revokedRetention: twice MaxTail, by when every write posted before the
// revocation is past its deadline.
func (c Config) revokedRetention() time.Duration { return 2 * c.maxTail() }

// revokedExposure is a revoked key waiting to be forgotten.
type revokedExposure struct {
	e  *exposure
	at time.Time
}

// noteRevoked queues e to be forgotten and forgets those revoked more than
// the retention ago. Caller holds t.mu.
func (t *Transport) noteRevokedLocked(e *exposure, now time.Time) {
	if !e.queued {
		e.queued = true
		t.revoked = append(t.revoked, revokedExposure{e: e, at: now})
	}
	keep := t.cfg.revokedRetention()
	i := 0
	for ; i < len(t.revoked) && now.Sub(t.revoked[i].at) > keep; i++ {
		old := t.revoked[i].e
		if t.keys[old.key] != old {
			continue // gone with its region already
		}
		delete(t.keys, old.key)
		old.region.mu.Lock()
		delete(old.region.keys, old.key)
		old.region.mu.Unlock()
	}
	t.revoked = t.revoked[i:]
}
