// Package mori is the kvfence transport plugin over MORI-IO (AMD's
// mori::io::IOEngine). MORI-IO has only a C++ API, so this project ships a
// small extern "C" shim of its own (shim/, compiled only by `make
// mori-shim` where MORI's headers and libmori_io.so exist) and this
// package loads that shim at run time (KVFENCE_MORI_SHIM). Without it the
// plugin refuses its handshake with one classified line naming the
// variable; a shim of another interface version is refused.
//
// It has NOT run against real MORI or AMD hardware: the Go side is tested
// against a fake of the shim interface (testdata); the C++ shim compiles
// against MORI 624002c8's headers but has never been linked or run.
//
// It owns: the shim interface (version 1), the mapping of MORI status codes
// (SUCCESS, INIT, IN_PROGRESS, errors above ERR_BEGIN), and its settings;
// the batch lifecycle and verdicts are package nocancel's.
//
// It must never report FailedDefinite after a write's first error (other
// queue pairs of the transfer may still be writing, and MORI cannot
// cancel), free a batch while a write is INIT or IN_PROGRESS (MORI writes
// into the caller-owned TransferStatus until it ends), or declare Revoke
// or a bounded MaxTail.
package mori
