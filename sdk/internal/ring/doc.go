// Package ring is the shared-memory data path between a kvfence host and
// its plugin process: two single-producer, single-consumer byte rings in
// one memfd, with doorbells: a futex word in the layout (v1), or a pipe
// per ring that the consumer's goroutine waits on in Go's netpoller (v2,
// pipebell.go). It is the sdk's internals, not part of its contract:
// package sdk frames Post and Completion into its records (ring_host.go,
// ring_plugin.go) and negotiates the rings, and their doorbells, over
// gRPC.
//
// The data path between host and plugin: two single-producer,
// single-consumer byte rings in one shared memfd — submissions (Post,
// host to plugin) and completions (Post results and Completions, plugin
// to host). gRPC keeps the control calls and the completion stream, whose
// end is still how the host learns that a plugin is gone.
//
// Each side trusts only what it writes itself: the producer keeps its tail
// and the consumer its head in private memory and only publishes them, so
// a plugin that scribbles over the shared pages can make the host see
// garbage records (which it rejects) but can never move the host's own
// indices. A record is published by one atomic store of the tail after
// every byte of it is written, and the consumer copies it out of shared
// memory once before parsing it, so a record is never half-read and never
// read twice (no double fetch).
//
// It owns: the layout (control page, host flags, two data areas), the
// record format, publishing (Publish, PublishQuiet, Doorbell: one wake-up
// per sleep of the consumer, on the futex or the pipe), reading with
// validation (Next), and the consumer's adaptive polling and sleep (Wait).
//
// It must never: block a producer on its doorbell (a pipe the consumer
// does not drain is written without waiting), trust an index or a record
// header it did not write (every one is checked against its own private
// position), read a
// record's bytes from shared memory twice, or know what a record means
// (Post, verdict and Completion are package sdk's).
package ring
