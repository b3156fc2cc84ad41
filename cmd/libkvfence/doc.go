// Command libkvfence is kvfence's C ABI: built with -buildmode=c-shared
// (`make bindings`) it becomes bin/libkvfence.so and bin/kvfence.h, through
// which C, Python (ctypes, python/kvfence) or any language with a C FFI
// embeds the runtime of package agent.
//
// The ABI's rules, each for a reason:
//   - Handles are opaque 64-bit integers from a registry (handles.go), never
//     Go pointers: cgo forbids C from keeping Go pointers, and a registry
//     turns a stale or forged handle into an InvalidArgument error instead
//     of a crash. Handles are never reused.
//   - Every call that can fail returns 0 or a kvfence error code (the
//     errdefs class plus one; errors.go) and fills a caller-owned
//     kvfence_error with the code and a message. No thread-local "last
//     error", so concurrent callers never see each other's errors.
//   - Bytes cross by copy into and out of caller memory (write_page,
//     read_page); the runtime's pools never leave Go's control. Staging
//     (stage.go: layout, gather, scatter; stage_abi.go's write_queued
//     copies a small row at the call and writes it after the gathers)
//     copies on Go threads after the call returned, so the caller keeps
//     its KV buffers allocated until
//     the gather is waited for or the request ended, and a receiver's
//     finish and close wait for its scatter. Buffers the CUDA driver says
//     are device memory are copied through gpumem (stage_gpu.go), never
//     touched by host code; a scatter into them runs only after the
//     request succeeded. In direct mode (direct.go) decode's engine buffer
//     (or one per layer: direct_buffers) is exported as a dma-buf at open
//     and writes land in it at the page indices kvfence_receiver_init_at
//     names; the engine reuses a page only once the request is released
//     (finished, or aborted after success, or drained, fenced, timed out).
//   - Poll-based: callers poll (or wait with a timeout); Go never calls
//     into C.
//   - Safe from several threads: agent calls go through each rank's event
//     loop; the registry is locked; a panic becomes an Internal error.
//   - Configuration is a JSON object (config.go), so the ABI does not break
//     when a field is added.
//   - Arguments are checked before use, in one place (checks.go): bounds on
//     configs, counts, page ranges, sizes and timeouts, and every read or
//     write of caller memory under debug.SetPanicOnFault, so a bad argument
//     is INVALID_ARGUMENT and never brings the engine's process down.
//
// It must never hand C a pointer into Go memory, call back into C, release
// memory on its own (the runtime and core decide that), let a Go panic
// unwind into C, or read caller memory it has not touched or probed first
// (checks.go).
package main
