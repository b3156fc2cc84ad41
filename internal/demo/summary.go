package demo

import (
	"sort"

	"github.com/kvfence/kvfence/agent"
)

// Summary is what one demo run found (kvfence demo prints it, --json
// emits it, the bench adds up one per repetition).
type Summary struct {
	Variant string `json:"variant"`
	Fence   bool   `json:"fence"`
	// RevokeAtAbort: decode revoked aborted requests' keys at the abort
	// (agent.DecodeStats.RevokeAtAbort), not after their drain.
	RevokeAtAbort bool `json:"revoke_at_abort"`
	Requests      int  `json:"requests"`
	Handoffs      int  `json:"handoffs"`
	Aborts        int  `json:"aborts"`
	CancelsSent   int  `json:"cancels_sent"`
	Failed        int  `json:"failed"`
	// Lost counts requests that did not hand off although the router
	// never cancelled them (failed requests: admission never succeeded,
	// the transfer failed, or no outcome came).
	Lost            int                `json:"lost_requests"`
	ReleasedDrained int                `json:"released_drained"`
	ReleasedFenced  int                `json:"released_fenced"`
	ReleasedTimeout int                `json:"released_timeout"`
	ReleasedDone    int                `json:"released_completed"`
	ReleasedUnsafe  int                `json:"released_unsafe"`
	HoldP50Ms       map[string]float64 `json:"hold_p50_ms"`
	HoldP99Ms       map[string]float64 `json:"hold_p99_ms"`
	HoldSlotSec     map[string]float64 `json:"hold_slot_seconds"`
	PagesVerified   int                `json:"pages_verified"`
	CorruptPages    int                `json:"corrupt_pages"`
	FreeWrites      int                `json:"free_writes"` // of corrupt_pages: late writes found in released memory
	StaleMessages   uint64             `json:"stale_messages"`
	// KeysBound: rank key sets bound to the rank's data identity;
	// KeysUnbound: admissions that also granted unbound keys (a rank not
	// connected to decode's transport yet). agent/writer_keys.go.
	KeysBound   int `json:"keys_bound"`
	KeysUnbound int `json:"keys_unbound"`
	// KeyCalls: decode's grant and revocation calls to its plugin (a
	// batch counts once; agent.DecodeStats.KeyCalls).
	KeyCalls int64 `json:"key_calls"`
	// The restart fence (--restart-fence-instances): target instances,
	// restarts (each reaped before its holds were released fenced), and
	// live exposures the restarts failed (the blast radius).
	TargetInstances  int     `json:"target_instances,omitempty"`
	TargetRestarts   int     `json:"target_restarts"`
	RestartFailed    int     `json:"restart_failed_exposures"`
	FailedPerRestart float64 `json:"restart_failed_per_restart"`
	Unreleased       int     `json:"unreleased_exposures"`
	Seconds          float64 `json:"seconds"`
	RequestsPerSec   float64 `json:"requests_per_second"`
	// MeanLatencyMs is the mean time a request took, from the moment a
	// client slot picked it up (admission retries included) to its end.
	MeanLatencyMs float64 `json:"mean_latency_ms"`
	// SteadyRequestsPerSec is concurrency / mean latency (Little's law):
	// the throughput while every client slot is busy, without the start
	// and the tail of the run, whose length depends on which slot drew
	// which requests — the benchmark compares arms on it.
	SteadyRequestsPerSec float64 `json:"steady_requests_per_second"`
	PoolSlots            int     `json:"pool_slots"`
	// CPUSeconds is the CPU time (user and system) each part of the run
	// used while requests ran: router (this process), decode and prefill
	// (the rank processes with their plugin processes).
	CPUSeconds map[string]float64 `json:"cpu_seconds,omitempty"`
	Dir        string             `json:"run_dir"`
	Report     string             `json:"report,omitempty"`

	// Holds are the hold durations (ms) by release path, and Series
	// decode's slots by state over the run: the HTML report draws them.
	Holds  map[string][]float64 `json:"-"`
	Series []agent.HeldSample   `json:"-"`
}

// summarize turns what the router counted and decode's stats at the end
// into the run's summary.
func summarize(o Options, c *counts, st agent.DecodeStats) *Summary {
	el := c.elapsed.Seconds()
	meanLat := c.latSum.Seconds() / float64(max(1, o.Requests))
	s := &Summary{Variant: o.Variant(), Fence: o.Fence, RevokeAtAbort: st.RevokeAtAbort, Requests: o.Requests, Handoffs: int(c.handed.Load()),
		Aborts: int(st.Core.Aborts), CancelsSent: int(c.cancels.Load()), Failed: int(c.failed.Load()), Lost: int(c.lost.Load()),
		ReleasedDrained: st.Released["drained"], ReleasedFenced: st.Released["fenced"], ReleasedTimeout: st.Released["timeout"],
		ReleasedDone: st.Released["completed"], ReleasedUnsafe: st.Released["unsafe"],
		HoldP50Ms: map[string]float64{}, HoldP99Ms: map[string]float64{}, HoldSlotSec: st.HoldSlotSec,
		PagesVerified: st.PagesVerified, CorruptPages: st.CorruptPages, FreeWrites: st.FreeWrites, StaleMessages: st.Core.StaleMessages,
		KeysBound: st.BoundGrants, KeysUnbound: st.UnboundGrants, KeyCalls: st.KeyCalls,
		Unreleased: st.LiveTags, Seconds: el, RequestsPerSec: float64(o.Requests) / el,
		MeanLatencyMs:        meanLat * 1000,
		SteadyRequestsPerSec: float64(o.Concurrency) / meanLat,
		PoolSlots:            o.PoolSlots(), Dir: o.Dir, Holds: st.HoldsMs, Series: st.Series,
		TargetInstances: o.RestartInstances, TargetRestarts: st.TargetRestarts, RestartFailed: int(st.Core.RestartFailed)}
	if s.TargetRestarts > 0 {
		s.FailedPerRestart = float64(s.RestartFailed) / float64(s.TargetRestarts)
	}
	for path, v := range st.HoldsMs {
		s.HoldP50Ms[path] = Quantile(v, 0.50)
		s.HoldP99Ms[path] = Quantile(v, 0.99)
	}
	return s
}

// Quantile is the q-quantile of v (nearest rank below; 0 for none).
func Quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}
