// Package verbs will hold the kvfence transport plugin on raw libibverbs
// (cgo), with receiver-side fencing through memory windows.
//
// It must never claim quiescence before every completion of a queue pair was
// harvested or the queue pair was flushed or destroyed.
//
// Not built yet: a later issue fills this package.
package verbs
