package tcp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
// both; batch/single is the ratio of wall time per exposure, and
// cpu-batch/single that of CPU time (host and plugin process together:
// on a busy machine the fence's cost is CPU), lower is better.
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
			var spent, cpu [2]time.Duration
			var n [2]int
			const round = 32
			b.ResetTimer()
			for done := 0; done < b.N; done += round {
				for j := range 2 {
					arm := (j + done/round) % 2 // alternate which arm goes first
					plugin0 := pluginCPU(p.Pid())
					host0 := hostCPU()
					start := time.Now()
					for range round {
						keyExposure(b, arms[arm], ws)
					}
					spent[arm] += time.Since(start)
					cpu[arm] += hostCPU() - host0
					cpu[arm] += pluginCPU(p.Pid()) - plugin0
					n[arm] += round
				}
			}
			per := func(d [2]time.Duration, arm int) float64 { return float64(d[arm]) / float64(n[arm]) / 1e3 }
			b.ReportMetric(per(spent, 0), "µs/exposure-single")
			b.ReportMetric(per(spent, 1), "µs/exposure-batch")
			b.ReportMetric(per(spent, 1)/per(spent, 0), "batch/single")
			b.ReportMetric(per(cpu, 1)/per(cpu, 0), "cpu-batch/single")
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

// hostCPU is the CPU time this process has used (every goroutine's).
func hostCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pluginCPU is the CPU time the plugin process pid has used: the sum of
// its threads' run time in /proc (nanoseconds, unlike /proc/pid/stat's
// ticks).
func pluginCPU(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that ended
		}
		if ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64); err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}
