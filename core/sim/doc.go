// Package sim runs whole kvfence clusters in deterministic simulation: a
// router, prefill ranks (TP), decode ranks (DP or MLA fan-out), a virtual
// clock with skewed node clocks, an adversarial control network (loss,
// duplication, delay, reordering, partitions) and a transport model with the
// real backends' behaviour (late completions, "timeouts" after which writes
// still land, failed slices that land again after the error, rank crashes
// whose writes stop only after a reap delay, decode restarts, tiny pools so
// freed slots are reused at once, room ids reused, abort storms) and, where
// a fence exists, a lying prefill rank that acks its drain and keeps writing.
//
// A checker keeps shadow ownership and content of every decode slot and
// asserts the invariants I1–I7 of docs/design.md §2 on every step. Everything random
// comes from the seed, so a seed replays exactly; a violation carries the
// seed and a short trace.
//
// sim drives the core only through its public API and must never do real
// I/O, read the wall clock or start goroutines inside a run.
package sim
