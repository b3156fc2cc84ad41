package tcp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// singleKeys hides a transport's KeyBatcher: sdk.GrantKeys and RevokeKeys
// then make one call per key, in parallel — what a host did before batch
// keys, and still does with a plugin without them.
type singleKeys struct{ sdk.Granter }

// BenchmarkKeyGrantRevoke is the per-exposure fence's key path alone,
// against a real plugin process as the decode agent reaches it: grant an
// exposure's keys, then revoke them, one call per key ("single") or one
// call for all ("batch"). The two arms run interleaved, in rounds of
// alternating order, on the same plugin, so load on the machine falls on
// both; batch/single is the ratio to read (lower is better).
func BenchmarkKeyGrantRevoke(b *testing.B) {
	for _, keys := range []int{2, 8} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			p := sdktest.Subprocess(b, pluginBin, sdk.OpenOptions{})
			g, region := keyBenchTarget(b, p.Transport())
			ws := make([]sdk.Window, keys)
			for i := range ws {
				ws[i] = sdk.Window{Region: region, Offset: uint64(i) << 12, Length: 4096}
			}
			arms := []sdk.Granter{singleKeys{g}, g}
			var spent [2]time.Duration
			var n [2]int
			const round = 32
			b.ResetTimer()
			for done := 0; done < b.N; done += round {
				for j := range 2 {
					arm := (j + done/round) % 2 // alternate which arm goes first
					start := time.Now()
					for range round {
						keyExposure(b, arms[arm], ws)
					}
					spent[arm] += time.Since(start)
					n[arm] += round
				}
			}
			single := float64(spent[0]) / float64(n[0])
			batch := float64(spent[1]) / float64(n[1])
			b.ReportMetric(single/1e3, "µs/exposure-single")
			b.ReportMetric(batch/1e3, "µs/exposure-batch")
			b.ReportMetric(batch/single, "batch/single")
		})
	}
}

// keyBenchTarget registers memory at t to grant keys over.
func keyBenchTarget(b *testing.B, t sdk.Transport) (sdk.Granter, sdk.RegionID) {
	mem, err := sdk.NewSharedMemory("keys", 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mem.Close() })
	region, err := t.RegisterMemory(context.Background(), mem.Desc())
	if err != nil {
		b.Fatal(err)
	}
	g := t.(sdk.Granter)
	if _, ok := g.(sdk.KeyBatcher); !ok {
		b.Fatal("the tcp plugin's host transport is not a KeyBatcher")
	}
	return g, region
}

// keyExposure grants ws and revokes the keys, as decode does per exposure.
func keyExposure(b *testing.B, g sdk.Granter, ws []sdk.Window) {
	ctx := context.Background()
	got := sdk.GrantKeys(ctx, g, ws)
	keys := make([]sdk.Key, len(got))
	for i, k := range got {
		if k.Err != nil {
			b.Fatal(k.Err)
		}
		keys[i] = k.Key
	}
	for _, r := range sdk.RevokeKeys(ctx, g, keys) {
		if r.Err != nil {
			b.Fatal(r.Err)
		}
	}
}
