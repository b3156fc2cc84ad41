package main

import (
	"math"
	"sort"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/kvfence/kvfence/internal/demo"
)

// benchArm is one arm of kvfence bench: a core variant and what its
// repetitions measured, pooled over reps (rep i of every arm uses seed i).
type benchArm struct {
	Name   string `json:"name"`
	unsafe string // known-unsafe core variant; "" = the real core
	Fence  bool   `json:"fence"` // per-exposure keys revoked on abort
	// checksums: the decode side verifies checksums at commit.
	checksums bool
	// agentArgs: extra flags for the arm's rank processes.
	agentArgs []string
	// RevokeAtAbort: decode revoked aborted requests' keys at the abort
	// (the last rep's summary says).
	RevokeAtAbort bool `json:"revoke_at_abort"`
	// ReqPerSec: steady-state req/s per rep (concurrency / mean latency);
	// WallReqPerSec: requests / wall time per rep.
	ReqPerSec     []float64 `json:"req_per_s"`
	WallReqPerSec []float64 `json:"wall_req_per_s"`
	MeanReqPerSec float64   `json:"mean_req_per_s"`
	CI95Low       float64   `json:"mean_ci95_low"`
	CI95High      float64   `json:"mean_ci95_high"`
	Aborts        int       `json:"aborts"`
	// HeldSlotSecPerAbort is every held slot-second (all release paths)
	// divided by the arm's aborts; lower is better.
	HeldSlotSecPerAbort float64            `json:"held_slot_seconds_per_abort"`
	HeldSlotSec         map[string]float64 `json:"held_slot_seconds"`
	HoldP50Ms           map[string]float64 `json:"hold_p50_ms"`
	HoldP99Ms           map[string]float64 `json:"hold_p99_ms"`
	Holds               map[string]int     `json:"holds"`
	CorruptPages        int                `json:"corrupt_pages"`
	FreeWrites          int                `json:"free_writes"`
	LostRequests        int                `json:"lost_requests"`
	// CPUMsPerRequest: per rep, the CPU time every process of the run
	// used while requests ran (router, decode and prefill ranks, their
	// plugin processes), per request; CPUPartsMs: its mean per part.
	CPUMsPerRequest     []float64          `json:"cpu_ms_per_request"`
	MeanCPUMsPerRequest float64            `json:"mean_cpu_ms_per_request"`
	CPUPartsMs          map[string]float64 `json:"cpu_ms_per_request_by_part"`
	// KeyCallsPerRequest: decode's grant and revocation calls to its
	// plugin per request, pooled over reps (0 without the fence).
	KeyCallsPerRequest float64 `json:"key_calls_per_request"`
	keyCalls, requests int64

	holds  map[string][]float64
	first  *demo.Summary // the first rep, for the report's capacity chart
	seeded []uint64
}

// add pools one repetition into the arm.
func (a *benchArm) add(s *demo.Summary, seed uint64) {
	if a.first == nil {
		a.first = s
		a.holds, a.HeldSlotSec = map[string][]float64{}, map[string]float64{}
	}
	a.seeded = append(a.seeded, seed)
	a.RevokeAtAbort = s.RevokeAtAbort
	a.ReqPerSec = append(a.ReqPerSec, s.SteadyRequestsPerSec)
	a.addCPU(s)
	a.WallReqPerSec = append(a.WallReqPerSec, s.RequestsPerSec)
	a.Aborts += s.Aborts
	a.CorruptPages += s.CorruptPages
	a.FreeWrites += s.FreeWrites
	a.LostRequests += s.Lost
	for p, v := range s.HoldSlotSec {
		a.HeldSlotSec[p] += v
	}
	for p, v := range s.Holds {
		a.holds[p] = append(a.holds[p], v...)
	}
}

// addCPU pools one repetition's CPU time per request.
func (a *benchArm) addCPU(s *demo.Summary) {
	if a.CPUPartsMs == nil {
		a.CPUPartsMs = map[string]float64{}
	}
	req := float64(max(1, s.Requests))
	var total float64
	for part, sec := range s.CPUSeconds {
		total += sec
		a.CPUPartsMs[part] += sec * 1000 / req
	}
	a.CPUMsPerRequest = append(a.CPUMsPerRequest, total*1000/req)
	a.keyCalls += s.KeyCalls
	a.requests += int64(s.Requests)
}

// finish computes the pooled figures once every rep is in.
func (a *benchArm) finish() {
	a.MeanReqPerSec, a.CI95Low, a.CI95High = meanCI(a.ReqPerSec)
	a.MeanCPUMsPerRequest, _, _ = meanCI(a.CPUMsPerRequest)
	a.KeyCallsPerRequest = float64(a.keyCalls) / float64(max(1, a.requests))
	for part := range a.CPUPartsMs {
		a.CPUPartsMs[part] /= float64(max(1, len(a.CPUMsPerRequest)))
	}
	var held float64
	for _, v := range a.HeldSlotSec {
		held += v
	}
	a.HeldSlotSecPerAbort = held / math.Max(1, float64(a.Aborts))
	a.HoldP50Ms, a.HoldP99Ms, a.Holds = map[string]float64{}, map[string]float64{}, map[string]int{}
	for p, v := range a.holds {
		a.HoldP50Ms[p], a.HoldP99Ms[p], a.Holds[p] = demo.Quantile(v, 0.50), demo.Quantile(v, 0.99), len(v)
	}
}

// releasePaths are the sorted release paths that held anything.
func releasePaths(holds map[string][]float64) []string {
	var ps []string
	for p, v := range holds {
		if len(v) > 0 {
			ps = append(ps, p)
		}
	}
	sort.Strings(ps)
	return ps
}

// benchDelta is a paired comparison of two arms: the mean over reps of
// (a/b - 1) in percent, with its 95% t-interval.
type benchDelta struct {
	Of       string    `json:"of"`
	Against  string    `json:"against"`
	PerRep   []float64 `json:"per_rep_pct"`
	Pct      float64   `json:"delta_pct"`
	CI95Low  float64   `json:"ci95_low_pct"`
	CI95High float64   `json:"ci95_high_pct"`
	// SpansZero: the interval contains 0, so this run cannot tell the
	// arms apart (the difference is within the noise).
	SpansZero bool   `json:"ci_spans_zero"`
	Verdict   string `json:"verdict"`
	// CPUPct is the paired mean over reps of (a/b - 1) in percent of the
	// CPU time per request (all processes), with its 95% t-interval:
	// positive means a used more CPU per request.
	CPUPct      float64 `json:"cpu_delta_pct"`
	CPUCI95Low  float64 `json:"cpu_ci95_low_pct"`
	CPUCI95High float64 `json:"cpu_ci95_high_pct"`
}

func newBenchDelta(a, b *benchArm) benchDelta {
	d := benchDelta{Of: a.Name, Against: b.Name}
	for i := range min(len(a.ReqPerSec), len(b.ReqPerSec)) {
		d.PerRep = append(d.PerRep, (a.ReqPerSec[i]/b.ReqPerSec[i]-1)*100)
	}
	d.Pct, d.CI95Low, d.CI95High = meanCI(d.PerRep)
	var cpu []float64
	for i := range min(len(a.CPUMsPerRequest), len(b.CPUMsPerRequest)) {
		if b.CPUMsPerRequest[i] > 0 {
			cpu = append(cpu, (a.CPUMsPerRequest[i]/b.CPUMsPerRequest[i]-1)*100)
		}
	}
	d.CPUPct, d.CPUCI95Low, d.CPUCI95High = meanCI(cpu)
	d.SpansZero = d.CI95Low <= 0 && d.CI95High >= 0
	switch {
	case d.SpansZero:
		d.Verdict = "the 95% CI spans 0: this run cannot tell the arms apart"
	case d.Pct < 0:
		d.Verdict = "the 95% CI excludes 0: " + a.Name + " is slower (higher req/s is better)"
	default:
		d.Verdict = "the 95% CI excludes 0: " + a.Name + " is faster (higher req/s is better)"
	}
	return d
}

// meanCI is the mean of xs with a 95% t-interval (the mean alone for
// fewer than two values).
func meanCI(xs []float64) (mean, lo, hi float64) {
	n := len(xs)
	if n == 0 {
		return 0, 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(n)
	if n < 2 {
		return mean, mean, mean
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	half := tQuantile975(n-1) * math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	return mean, mean - half, mean + half
}

// tQuantile975 is Student's t 0.975 quantile for df degrees of freedom.
func tQuantile975(df int) float64 {
	return distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(df)}.Quantile(0.975)
}
