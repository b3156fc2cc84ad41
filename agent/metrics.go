package agent

import (
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvfence/kvfence/core"
)

// Metrics are one agent's Prometheus figures. Counters the core already
// keeps are exported from core's own Metrics at scrape time (so the two can
// never disagree); the rest are observed by the agent as things happen.
type Metrics struct {
	Registry *prometheus.Registry

	releases    *prometheus.CounterVec   // path
	holdSeconds *prometheus.HistogramVec // path
	rejected    *prometheus.CounterVec   // reason: forged, foreign, replayed, misaddressed, wrong-kind
	failedSends *prometheus.CounterVec   // what: control, post
	inDoubt     prometheus.Counter
	quiesceSecs prometheus.Histogram
	quiesceEv   *prometheus.CounterVec // evidence
	verified    prometheus.Counter
	corrupt     prometheus.Counter
	checksumBad prometheus.Counter
	revokeSecs  prometheus.Histogram
	writerTail  *prometheus.GaugeVec // peer_rank
}

var holdBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// newMetrics makes the agent's metrics on a fresh registry, with gauges read
// from the core at scrape time through snap (which must be cheap and safe
// from any goroutine).
func newMetrics(role string, rank uint32, snap func() metricsSnapshot) *Metrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"role": role, "rank": itoa(int(rank))}
	m := &Metrics{Registry: reg}
	m.releases = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfence_releases_total",
		Help: "Exposures returned to the pool, by path (drained, fenced, timeout, completed, unsafe).", ConstLabels: labels}, []string{"path"})
	m.holdSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvfence_hold_duration_seconds",
		Help: "How long aborted or rejected exposures stayed held after they stopped, by release path.", ConstLabels: labels, Buckets: holdBuckets}, []string{"path"})
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfence_rejected_messages_total",
		Help: "Control messages the agent refused before the core saw them, by reason.", ConstLabels: labels}, []string{"reason"})
	m.failedSends = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfence_failed_sends_total",
		Help: "Control frames dropped (link down or full) and transport posts refused.", ConstLabels: labels}, []string{"what"})
	m.inDoubt = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfence_in_doubt_completions_total",
		Help: "Transport batches that completed InDoubt (bytes may still move until quiesced).", ConstLabels: labels})
	m.quiesceSecs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvfence_quiesce_duration_seconds",
		Help: "How long Transport.Quiesce took to give evidence.", ConstLabels: labels, Buckets: holdBuckets})
	m.quiesceEv = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvfence_quiesced_batches_total",
		Help: "In-doubt batches settled by quiescence evidence, by the transport's evidence (receiver-confirmed, receiver-closed, endpoint-flushed, process-exited, ...).", ConstLabels: labels}, []string{"evidence"})
	m.revokeSecs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvfence_revoke_duration_seconds",
		Help: "How long revoking an exposure's keys took.", ConstLabels: labels, Buckets: holdBuckets})
	m.writerTail = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvfence_writer_tail_seconds",
		Help: "The tail bounding each prefill rank's writes in decode's timeout release: the larger of the tail the rank's transport declared and decode's own.", ConstLabels: labels}, []string{"peer_rank"})
	m.verified = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfence_pages_verified_total",
		Help: "Pages checked against the content oracle at handoff and at finish.", ConstLabels: labels})
	m.corrupt = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfence_corrupt_pages_total",
		Help: "Pages that held bytes other than their own request's. Must stay 0.", ConstLabels: labels})
	m.checksumBad = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvfence_checksum_mismatches_total",
		Help: "Commits whose checksum did not match the pages decode holds (the request was aborted, not handed off).", ConstLabels: labels})
	reg.MustRegister(m.releases, m.holdSeconds, m.rejected, m.failedSends, m.inDoubt, m.quiesceSecs, m.quiesceEv, m.revokeSecs, m.verified, m.corrupt, m.checksumBad, m.writerTail)
	reg.MustRegister(&snapshotCollector{snap: snap, labels: labels})
	return m
}

func (m *Metrics) observeRelease(rel core.Release) {
	m.releases.WithLabelValues(rel.Path.String()).Inc()
	if rel.Path != core.PathCompleted {
		m.holdSeconds.WithLabelValues(rel.Path.String()).Observe(rel.Held.Seconds())
	}
}

func (m *Metrics) reject(reason string)     { m.rejected.WithLabelValues(reason).Inc() }
func (m *Metrics) failedSend(what string)   { m.failedSends.WithLabelValues(what).Inc() }
func (m *Metrics) quiesced(d time.Duration) { m.quiesceSecs.Observe(d.Seconds()) }
func (m *Metrics) revoked(d time.Duration)  { m.revokeSecs.Observe(d.Seconds()) }

func (m *Metrics) tail(rank core.RankID, d time.Duration) {
	m.writerTail.WithLabelValues(itoa(int(rank))).Set(d.Seconds())
}

// evidence counts batches settled by quiescence evidence of one kind.
func (m *Metrics) evidence(ev string, batches int) {
	m.quiesceEv.WithLabelValues(ev).Add(float64(batches))
}

// metricsSnapshot is the gauges and core counters read at scrape time.
type metricsSnapshot struct {
	Receiver *core.ReceiverMetrics
	Sender   *core.SenderMetrics
}

type snapshotCollector struct {
	snap   func() metricsSnapshot
	labels prometheus.Labels
}

func (c *snapshotCollector) desc(name, help string, varLabels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, varLabels, c.labels)
}

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	counter := func(d *prometheus.Desc, v uint64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	if r := s.Receiver; r != nil {
		ex := c.desc("kvfence_exposures_slots", "Decode slots by exposure state (assigned, held = aborting, handed, quarantined).", "state")
		gauge(ex, float64(r.AssignedSlots), "assigned")
		gauge(ex, float64(r.HeldSlots), "held")
		gauge(ex, float64(r.HandedSlots), "handed")
		gauge(ex, float64(r.QuarantinedSlots), "quarantined")
		gauge(c.desc("kvfence_held_capacity_bytes", "Bytes held by aborted exposures waiting for drained, fenced or timeout."), float64(r.HeldBytes))
		counter(c.desc("kvfence_stale_messages_total", "Messages with an old generation or instance, ignored by the core (I4)."), r.StaleMessages)
		counter(c.desc("kvfence_heartbeat_resyncs_total", "Heartbeat sessions decode restarted from a full list (restart, new rank incarnation, divergence)."), r.Resyncs)
		counter(c.desc("kvfence_core_foreign_messages_total", "Messages the core refused: rank not named by the assignment, or misaddressed."), r.ForeignMessages)
		counter(c.desc("kvfence_handoffs_total", "Requests handed to the decode loop."), r.Handoffs)
		counter(c.desc("kvfence_aborts_total", "Exposures aborted before handoff."), r.Aborts)
		counter(c.desc("kvfence_target_restarts_total", "Target plugin instances the restart fence asked to restart (restart.go)."), r.TargetRestarts)
		counter(c.desc("kvfence_restart_failed_exposures_total", "Live exposures a target restart failed: the restart fence's blast radius."), r.RestartFailed)
		counter(c.desc("kvfence_admitted_total", "Exposures admitted."), r.Admitted)
	}
	if sm := s.Sender; sm != nil {
		counter(c.desc("kvfence_batches_posted_total", "Transport batches posted."), sm.Posted)
		counter(c.desc("kvfence_batches_quiesced_total", "Batches covered by quiescence evidence."), sm.Quiesced)
		counter(c.desc("kvfence_drain_acks_total", "DrainAcks sent."), sm.DrainAcks)
		counter(c.desc("kvfence_commits_total", "Commits sent."), sm.Commits)
		counter(c.desc("kvfence_stale_messages_total", "Messages for another rank or of a kind a rank never takes."), sm.StaleMessages)
		gauge(c.desc("kvfence_unsettled_batches", "Batches that may still move bytes."), float64(sm.Unsettled))
		gauge(c.desc("kvfence_streams", "Live streams (tag, decode rank)."), float64(sm.Streams))
	}
}

// ServeMetrics serves /metrics on addr (":0" style addresses allowed) and
// returns the bound address.
func ServeMetrics(addr string, reg *prometheus.Registry) (string, func(), error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String(), func() { _ = srv.Close() }, nil
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	neg := i < 0
	if neg {
		i = -i
	}
	var b [20]byte
	n := len(b)
	for i > 0 {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		n--
		b[n] = '-'
	}
	return string(b[n:])
}
