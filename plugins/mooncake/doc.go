// Package mooncake will hold the kvfence transport plugin that wraps the
// Mooncake Transfer Engine through its C API.
//
// It owns the mapping from Mooncake's batch statuses onto the kvfence
// completion contract (Succeeded / FailedDefinite / InDoubt). It must never
// report a batch as failed-definite on Mooncake's word alone: Mooncake resends
// failed slices and its timeouts do not stop writes.
//
// Not built yet: a later issue fills this package.
package mooncake
