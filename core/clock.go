package core

import (
	"math"
	"time"
)

// Time is a point on the caller's clock in nanoseconds. The core never reads
// a clock: every input carries the time.
//
// Every computation on Time saturates instead of wrapping: a lease, tail or
// margin from a peer or a configuration, however large, can only push a
// deadline later (to MaxTime, which no real clock reaches), never around to
// the past where it would release memory early. A bound adds its durations
// to the time one at a time (t.Add(lease).Add(tail)...): summing them first
// would saturate the sum and, for a clock below zero, give an earlier
// deadline than the exact one.
type Time int64

// MinTime and MaxTime are the ends of the clock; arithmetic stops there.
const (
	MinTime Time = math.MinInt64
	MaxTime Time = math.MaxInt64
)

// Add returns t+d, saturated at MinTime and MaxTime.
func (t Time) Add(d time.Duration) Time {
	switch {
	case d > 0 && t > MaxTime-Time(d):
		return MaxTime
	case d < 0 && t < MinTime-Time(d):
		return MinTime
	}
	return t + Time(d)
}

// Sub returns t-u as a duration, saturated at the largest and smallest
// durations.
func (t Time) Sub(u Time) time.Duration {
	switch {
	case u < 0 && t > MaxTime+u:
		return math.MaxInt64
	case u > 0 && t < MinTime+u:
		return math.MinInt64
	}
	return time.Duration(t - u)
}

// elapsed is how long ago since was, never negative: a clock that went
// backwards shows no time passed rather than a negative hold.
func elapsed(now, since Time) time.Duration {
	return max(now.Sub(since), 0)
}
