package agent

import (
	"github.com/kvfence/kvfence/core"
)

// DecodeStats are a decode agent's figures (Decode.Stats): the core's
// counters, hold durations by release path, the content check's findings
// (zero without a ContentCheck), and held capacity over time.
type DecodeStats struct {
	Core          core.ReceiverMetrics `json:"core"`
	Handoffs      int                  `json:"handoffs"`
	PagesVerified int                  `json:"pages_verified"`
	CorruptPages  int                  `json:"corrupt_pages"`
	// FreeWrites counts pages found written while they were free (I1: a
	// late write into released memory); each is also a corrupt page.
	FreeWrites  int                  `json:"free_writes"`
	HoldsMs     map[string][]float64 `json:"holds_ms"` // by path, aborted/rejected exposures only
	Released    map[string]int       `json:"released"`
	HoldSlotSec map[string]float64   `json:"hold_slot_seconds"` // by path: held slots × seconds
	Series      []HeldSample         `json:"series"`
	LiveTags    int                  `json:"live_tags"`
	// RevokeAtAbort: the fence revokes an aborted request's keys at the
	// abort (DecodeConfig.Revoke, resolved against the transport).
	RevokeAtAbort  bool   `json:"revoke_at_abort"`
	ReplaysRefused uint64 `json:"replays_refused"`
	// BoundGrants: rank key sets bound to the rank's data identity;
	// UnboundGrants: exposures that also needed unbound keys (a rank's
	// identity unknown or not connected yet). writer_keys.go.
	BoundGrants   int `json:"bound_grants,omitempty"`
	UnboundGrants int `json:"unbound_grants,omitempty"`
	// KeyCalls: per-exposure grant and revocation calls made to the
	// plugin, a batch counting once (each a round trip to the plugin
	// process: what the fence costs in CPU besides the core).
	KeyCalls int64 `json:"key_calls,omitempty"`
	// NoWriterKeys: ranks refused keys for an exposure because they
	// announced no data identity to a transport that binds writers.
	NoWriterKeys int `json:"no_writer_keys,omitempty"`
	// TargetRestarts: target instances reaped and started again
	// (restart.go); the core's RestartFailed is their blast radius.
	TargetRestarts int `json:"target_restarts,omitempty"`
}

// HeldSample is decode's slot usage at one moment (seconds since start).
type HeldSample struct {
	T        float64 `json:"t"`
	Held     int     `json:"held"`
	Assigned int     `json:"assigned"`
	Handed   int     `json:"handed"`
}

func (s *DecodeStats) addRelease(rel core.Release) {
	if s.Released == nil {
		s.Released = map[string]int{}
		s.HoldsMs = map[string][]float64{}
		s.HoldSlotSec = map[string]float64{}
	}
	p := rel.Path.String()
	s.Released[p]++
	if rel.Path != core.PathCompleted {
		s.HoldsMs[p] = append(s.HoldsMs[p], float64(rel.Held.Microseconds())/1000)
		s.HoldSlotSec[p] += rel.Held.Seconds() * float64(len(rel.Slots))
	}
}

func (s DecodeStats) clone() DecodeStats {
	c := s
	c.HoldsMs = map[string][]float64{}
	for k, v := range s.HoldsMs {
		c.HoldsMs[k] = append([]float64(nil), v...)
	}
	c.HoldSlotSec = map[string]float64{}
	for k, v := range s.HoldSlotSec {
		c.HoldSlotSec[k] = v
	}
	c.Released = map[string]int{}
	for k, v := range s.Released {
		c.Released[k] = v
	}
	c.Series = append([]HeldSample(nil), s.Series...)
	return c
}
