// Package mori will hold the kvfence transport plugin that wraps MORI-IO.
//
// It owns the mapping of MORI status codes onto the kvfence completion
// contract. It must never report FailedDefinite after a first error CQE while
// other queue pairs of the batch may still be in flight.
//
// Not built yet: a later issue fills this package.
package mori
