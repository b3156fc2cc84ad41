package core

import (
	"math"
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

// extremes are the durations and clock readings where arithmetic wraps.
var extremes = []int64{0, 1, -1, 1 << 62, -(1 << 62), math.MaxInt64, math.MaxInt64 - 1, math.MinInt64, math.MinInt64 + 1,
	int64(time.Millisecond), -int64(time.Millisecond), int64(5 * time.Minute)}

// extremeInt64 draws mostly extreme values, sometimes any.
func extremeInt64(t *rapid.T, label string) int64 {
	if rapid.IntRange(0, 3).Draw(t, label+"-any") == 0 {
		return rapid.Int64().Draw(t, label)
	}
	return rapid.SampledFrom(extremes).Draw(t, label)
}

func satDuration(a, b time.Duration) time.Duration {
	return time.Duration(clamp(new(big.Int).Add(big.NewInt(int64(a)), big.NewInt(int64(b)))))
}

func clamp(x *big.Int) int64 {
	switch {
	case x.Cmp(big.NewInt(math.MaxInt64)) > 0:
		return math.MaxInt64
	case x.Cmp(big.NewInt(math.MinInt64)) < 0:
		return math.MinInt64
	}
	return x.Int64()
}

// TestTimeArithmeticSaturates: Add, Sub and chained Adds are the exact
// result, clamped to the int64 range: never wrapped.
func TestTimeArithmeticSaturates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, c := extremeInt64(t, "a"), extremeInt64(t, "b"), extremeInt64(t, "c")
		if got, want := Time(a).Add(time.Duration(b)), clamp(new(big.Int).Add(big.NewInt(a), big.NewInt(b))); int64(got) != want {
			t.Fatalf("%d.Add(%d) = %d, want %d", a, b, got, want)
		}
		if got, want := Time(a).Sub(Time(b)), clamp(new(big.Int).Sub(big.NewInt(a), big.NewInt(b))); int64(got) != want {
			t.Fatalf("%d.Sub(%d) = %d, want %d", a, b, got, want)
		}
		if b >= 0 && c >= 0 { // a bound adds non-negative durations one at a time
			want := clamp(new(big.Int).Add(new(big.Int).Add(big.NewInt(a), big.NewInt(b)), big.NewInt(c)))
			if got := Time(a).Add(time.Duration(b)).Add(time.Duration(c)); int64(got) != want {
				t.Fatalf("%d.Add(%d).Add(%d) = %d, want %d", a, b, c, got, want)
			}
		}
		if got := elapsed(Time(a), Time(b)); got < 0 {
			t.Fatalf("elapsed(%d, %d) = %v", a, b, got)
		}
	})
}

// extremeTimes: configurations, declared tails and clocks at the edges of
// int64 (0, 1ns, 2^62, MaxInt64, negative), clocks that start near either
// end and go backwards. The clock stays below MaxTime, the horizon no real
// clock reaches (a saturated deadline means "never").
var extremeTimes = propTimes{
	config: func(t *rapid.T, cfg *ReceiverConfig) {
		durs := []time.Duration{1, time.Microsecond, time.Millisecond, time.Second, 1 << 62, math.MaxInt64}
		cfg.Lease = rapid.SampledFrom(durs).Draw(t, "lease")
		cfg.MaxHold = satDuration(cfg.Lease, rapid.SampledFrom(append(durs, 0)).Draw(t, "hold-extra"))
		cfg.MaxTail = rapid.SampledFrom(append(durs, 0)).Draw(t, "own-tail")
		cfg.ClockMargin = rapid.SampledFrom(append(durs, 0)).Draw(t, "margin")
		cfg.MaxDeclaredTail = rapid.SampledFrom([]time.Duration{0, cfg.MaxTail, satDuration(cfg.MaxTail, time.Millisecond), math.MaxInt64}).Draw(t, "max-declared")
		cfg.AbortRetransmit = rapid.SampledFrom([]time.Duration{0, 1, math.MaxInt64}).Draw(t, "retransmit")
	},
	tail: func(t *rapid.T) time.Duration {
		return rapid.SampledFrom([]time.Duration{-1, math.MinInt64, 0, 1, time.Millisecond, 5 * time.Minute, 5*time.Minute + 1, 1 << 62, math.MaxInt64}).Draw(t, "tail")
	},
	start: func(t *rapid.T) Time {
		return rapid.SampledFrom([]Time{MinTime, MinTime + 1, -1, 0, 1, 1 << 62, MaxTime - Time(time.Millisecond), MaxTime - 1}).Draw(t, "start")
	},
	step: func(t *rapid.T, now Time) Time {
		dt := rapid.SampledFrom([]int64{0, 1, int64(time.Microsecond), int64(100 * time.Microsecond), int64(time.Millisecond),
			int64(time.Second), 1 << 62, math.MaxInt64, -1, -int64(time.Millisecond), -(1 << 62)}).Draw(t, "dt")
		return Time(min(clamp(new(big.Int).Add(big.NewInt(int64(now)), big.NewInt(dt))), math.MaxInt64-1))
	},
}

// TestReceiverPropertiesExtremeTimes: the receiver properties (no release
// before its evidence or its exact bound, slots accounted for) hold with
// any configured or declared duration and any clock, including clocks that
// go backwards; tails above the maximum are refused as invalid arguments.
func TestReceiverPropertiesExtremeTimes(t *testing.T) {
	rapid.Check(t, receiverPropertiesWith(knownunsafe.Safe, extremeTimes))
}
