package main

import (
	"os"
	"runtime"
)

// spareProcs is how many Go processors the library adds to the runtime's
// default when it is loaded into an engine.
//
// Why: every call from the engine's threads (send, poll) needs a Go
// processor to run on. With the default (one per core), a rank's loop
// copying a gather piece and the transport's goroutines can hold all of
// them, and the scheduler thread's call then waits for one to come free
// (docs/sglang.md: prefill poll() p99 368 µs with the default vs 181 µs with
// GOMAXPROCS=8, same bench alternated). Spare processors let the call run
// at once and leave the sharing of cores to the OS, which favours the
// short call. An operator's GOMAXPROCS is kept as it is.
const spareProcs = 2

func init() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + spareProcs)
}
