package main

// #include "abi.h"
import "C"

import (
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/core"
)

// The C ABI's argument checks, in one place: every count, length, size,
// timeout and caller pointer an exported function takes is checked here
// before it is used, so a hostile or buggy caller gets INVALID_ARGUMENT and
// the engine that loaded us stays up. abi.h documents the same ranges.
const (
	// maxPages bounds a request's pages (and send/finish counts).
	maxPages = 1 << 24
	// maxRanks bounds the prefill ranks of one request (and a decode
	// rank's shards): the restart fence's limit.
	maxRanks = 64
	// maxConfigBytes bounds a JSON config read from C.
	maxConfigBytes = 1 << 20
	// maxTimingCount and maxTimingWork bound the timing helpers.
	maxTimingCount = 1 << 24
	maxTimingWork  = time.Second
	// maxWaitMs clamps kvfence_wait's timeout (so it never overflows a
	// time.Duration).
	maxWaitMs = math.MaxInt64 / int64(time.Millisecond)
	// Config bounds: counts, sizes and the pool a rank maps.
	maxSlots      = 1 << 24
	maxShardBytes = 1 << 34
	maxPoolBytes  = 1 << 40
	maxSmallCount = 1 << 16
	maxConfigMs   = 7 * 24 * 3600 * 1000
)

// touch runs f, which reads or writes caller memory, on the calling
// goroutine with faults turned into panics (debug.SetPanicOnFault), and
// turns any panic into INVALID_ARGUMENT: a pointer that is not mapped, or
// not mapped for that access, must not kill the engine's process.
func touch(what string, f func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			err = invalid("%s: caller memory not accessible (%v)", what, r)
		}
	}()
	f()
	return nil
}

// probe reads one byte of every 4 KiB of n bytes at p (and the last), so
// that memory another goroutine copies later (a rank's event loop, where a
// fault could not be caught) is known to be readable now.
func probe(what string, p unsafe.Pointer, n int) error {
	if n == 0 {
		return nil
	}
	return touch(what, func() {
		b := unsafe.Slice((*byte)(p), n)
		var sum byte
		for i := 0; i < n; i += 4096 {
			sum ^= b[i]
		}
		probeSink.Store(uint32(sum ^ b[n-1])) // stored, so the compiler keeps the reads
	})
}

// probeSink keeps probe's reads: loads whose value is unused may be dropped.
var probeSink atomic.Uint32

// bytesAt is n bytes of caller memory at p, or INVALID_ARGUMENT when p is
// NULL, size (the caller's claim) is below n, or n is not a length.
func bytesAt(what string, p unsafe.Pointer, size C.size_t, n int64) ([]byte, error) {
	if n < 0 || n > maxPoolBytes {
		return nil, invalid("%s: %d bytes is not a length", what, n)
	}
	if p == nil || uint64(size) < uint64(n) {
		return nil, invalid("%s holds %d bytes, %d needed", what, uint64(size), n)
	}
	if n == 0 {
		return nil, nil
	}
	return unsafe.Slice((*byte)(p), int(n)), nil
}

// goString reads a NUL-terminated string of at most max bytes from C under
// touch: C.GoString would read without bound and fault uncaught.
func goString(what string, p *C.char, max int) (string, error) {
	if p == nil {
		return "", invalid("%s must not be NULL", what)
	}
	var s string
	var found bool
	err := touch(what, func() {
		base := unsafe.Pointer(p)
		for i := 0; i < max; i++ {
			if *(*byte)(unsafe.Add(base, i)) == 0 {
				s, found = string(unsafe.Slice((*byte)(base), i)), true
				return
			}
		}
	})
	if err == nil && !found {
		err = invalid("%s: no NUL in its first %d bytes", what, max)
	}
	return s, err
}

// setHandle writes *out under touch.
func setHandle(out *C.kvfence_handle, h uint64) error {
	if out == nil {
		return invalid("out must not be NULL")
	}
	return touch("out", func() { *out = C.kvfence_handle(h) })
}

// ranksAt reads n prefill ranks from C, n checked against 1..limit first.
func ranksAt(p *C.uint32_t, n C.int, limit int) ([]uint32, error) {
	if limit <= 0 || limit > maxRanks {
		limit = maxRanks
	}
	if p == nil || n <= 0 || int(n) > limit {
		return nil, invalid("a request has 1..%d prefill ranks (one per shard of a slot) in a non-NULL array, got %d", limit, n)
	}
	rs := make([]uint32, int(n))
	err := touch("ranks", func() { copy(rs, unsafe.Slice((*uint32)(unsafe.Pointer(p)), int(n))) })
	return rs, err
}

// pageCount checks a page count or index bound: 0..maxPages (1..maxPages
// when atLeastOne).
func pageCount(what string, n C.int, atLeastOne bool) error {
	lo := 0
	if atLeastOne {
		lo = 1
	}
	if int(n) < lo || int(n) > maxPages {
		return invalid("%s %d outside %d..%d", what, n, lo, maxPages)
	}
	return nil
}

// pageRange checks [first, first+count) against a request of n pages.
func pageRange(first, count C.int, n int) error {
	if first < 0 || count < 0 || int64(first)+int64(count) > int64(n) {
		return invalid("pages [%d, %d) of a %d-page request", first, int64(first)+int64(count), n)
	}
	return nil
}

// waitFor is kvfence_wait's timeout: negative is invalid, huge is clamped.
func waitFor(ms C.int64_t) (time.Duration, error) {
	if ms < 0 {
		return 0, invalid("timeout_ms %d is negative", ms)
	}
	return time.Duration(min(int64(ms), maxWaitMs)) * time.Millisecond, nil
}

// timingCount checks a timing helper's count.
func timingCount(n C.int64_t) error {
	if n < 1 || n > maxTimingCount {
		return invalid("count %d outside 1..%d", n, maxTimingCount)
	}
	return nil
}

// timed runs step up to n times, stopping after maxTimingWork, and returns
// the mean nanoseconds per step.
func timed(n int64, step func()) C.double {
	start := time.Now()
	var i int64
	for i < n {
		step()
		i++
		if i%256 == 0 && time.Since(start) > maxTimingWork {
			break
		}
	}
	return C.double(time.Since(start).Nanoseconds()) / C.double(i)
}

// gone holds, per registered object, a channel closed when its handle
// closes, so kvfence_wait wakes at once instead of at its timeout.
var gone sync.Map // object -> chan struct{}

func markOpen(v any) { gone.Store(v, make(chan struct{})) }

func markClosed(v any) {
	if ch, ok := gone.LoadAndDelete(v); ok {
		close(ch.(chan struct{}))
	}
}

// goneCh is v's channel, or nil once v's handle closed.
func goneCh(v any) chan struct{} {
	ch, ok := gone.Load(v)
	if !ok {
		return nil
	}
	return ch.(chan struct{})
}

// checkDecodeConfig bounds decode's counts, sizes and times.
func checkDecodeConfig(j decodeJSON) error {
	shards := max(j.Shards, 1)
	switch {
	case j.Slots <= 0 || j.Slots > maxSlots:
		return invalid("config: slots %d outside 1..%d", j.Slots, maxSlots)
	case j.ShardBytes <= 0 || j.ShardBytes > maxShardBytes:
		return invalid("config: shard_bytes %d outside 1..%d", j.ShardBytes, int64(maxShardBytes))
	case j.Shards < 0 || j.Shards > maxRanks:
		return invalid("config: shards %d outside 1..%d", j.Shards, maxRanks)
	case int64(j.Slots)*int64(shards) > maxPoolBytes/j.ShardBytes:
		return invalid("config: a pool of %d slots × %d shards × %d bytes is over %d bytes", j.Slots, shards, j.ShardBytes, int64(maxPoolBytes))
	case j.MaxDeclaredTailMs < 0:
		return invalid("config: max_declared_tail_ms %d is negative: it is the longest transport tail a prefill rank may declare (0: the default, %v)",
			j.MaxDeclaredTailMs, core.DefaultMaxDeclaredTail)
	}
	return checkMs(map[string]int64{"lease_ms": j.LeaseMs, "max_hold_ms": j.MaxHoldMs, "clock_margin_ms": j.ClockMarginMs,
		"max_declared_tail_ms": j.MaxDeclaredTailMs})
}

// checkPrefillConfig bounds prefill's counts, sizes and times.
func checkPrefillConfig(j prefillJSON) error {
	switch {
	case j.SourcePages <= 0 || j.SourcePages > maxSlots:
		return invalid("config: source_pages %d outside 1..%d", j.SourcePages, maxSlots)
	case j.ShardBytes <= 0 || j.ShardBytes > maxShardBytes:
		return invalid("config: shard_bytes %d outside 1..%d", j.ShardBytes, int64(maxShardBytes))
	case int64(j.SourcePages) > maxPoolBytes/j.ShardBytes:
		return invalid("config: %d source pages × %d bytes is over %d bytes", j.SourcePages, j.ShardBytes, int64(maxPoolBytes))
	}
	for name, v := range map[string]int{"lanes": j.Lanes, "max_inflight": j.MaxInflight, "max_batch_pages": j.MaxBatchPages} {
		if v < 0 || v > maxSmallCount {
			return invalid("config: %s %d outside 0..%d (0: the default)", name, v, maxSmallCount)
		}
	}
	return checkMs(map[string]int64{"heartbeat_ms": j.HeartbeatMs, "skew_margin_ms": j.SkewMarginMs,
		"request_tombstone_ms": j.RequestTombstoneMs, "bootstrap_timeout_ms": j.BootstrapTimeoutMs, "quiesce_grace_ms": j.QuiesceGraceMs})
}

func checkMs(fields map[string]int64) error {
	for name, v := range fields {
		if v < 0 || v > maxConfigMs {
			return invalid("config: %s %d outside 0..%d (0: the default)", name, v, maxConfigMs)
		}
	}
	return nil
}

// errorOut writes code and msg into the caller's kvfence_error under touch
// and returns code: an error struct that cannot be written is left unfilled
// (the call's outcome is the code either way).
func errorOut(e *C.kvfence_error, code C.int, msg string) C.int {
	if e == nil {
		return code
	}
	_ = touch("error", func() {
		e.code = C.int32_t(code)
		buf := unsafe.Slice((*byte)(unsafe.Pointer(&e.message[0])), len(e.message))
		n := copy(buf[:len(buf)-1], msg)
		buf[n] = 0
	})
	return code
}
