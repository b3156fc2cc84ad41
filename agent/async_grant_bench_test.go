package agent

import "testing"

// BenchmarkGrantPath is what the fence's grant costs on the request path
// (issue 21 item 1): requests of 8 pages through a decode rank and two
// prefill ranks (TCP plugin processes) in three clusters, the arms
// rotated each round: no fence; the fence granting in Init on the loop
// (syncGrants, as before); the fence granting off the loop (the shipped
// default). Reports each arm's requests per second and mean Init time,
// and the ratios against the synchronous arm and against no fence.
//
//	go test ./agent/ -run '^$' -bench BenchmarkGrantPath -benchtime 300x
func BenchmarkGrantPath(b *testing.B) {
	off := startBenchClusterWith(b, func(c *DecodeConfig) { c.Fence = false })
	syncG := startBenchClusterWith(b, func(c *DecodeConfig) { c.syncGrants = true })
	async := startBenchClusterWith(b, func(*DecodeConfig) {})
	cs := []*benchCluster{off, syncG, async}
	for _, c := range cs {
		// The first request opens the ranks' data connections (unbound
		// keys); its Init is not counted.
		if err := c.request(8); err != nil {
			b.Fatal(err)
		}
		c.initSum = 0
	}
	sums := rotateRequests(b, cs, 8)
	// rotateRequests' own warm-up request is counted in initSum: b.N+1.
	initUs := func(c *benchCluster) float64 { return float64(c.initSum.Microseconds()) / float64(b.N+1) }
	b.ReportMetric(float64(b.N)/sums[0].Seconds(), "off-req/s")
	b.ReportMetric(float64(b.N)/sums[1].Seconds(), "sync-req/s")
	b.ReportMetric(float64(b.N)/sums[2].Seconds(), "async-req/s")
	b.ReportMetric(initUs(off), "off-init-µs")
	b.ReportMetric(initUs(syncG), "sync-init-µs")
	b.ReportMetric(initUs(async), "async-init-µs")
	b.ReportMetric(sums[1].Seconds()/sums[2].Seconds(), "async/sync-throughput")
	b.ReportMetric(sums[0].Seconds()/sums[2].Seconds(), "async/off-throughput")
	b.ReportMetric(sums[0].Seconds()/sums[1].Seconds(), "sync/off-throughput")
}
