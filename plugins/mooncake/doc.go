// Package mooncake is the kvfence transport plugin over Mooncake Transfer
// Engine's C API (libtransfer_engine.so), loaded at run time with
// dlopen/dlsym: the plugin builds and its tests run without Mooncake, and
// without the library it refuses its handshake with one classified line
// naming KVFENCE_MOONCAKE_LIB.
//
// It owns: the library's symbols and this plugin's version rule (required
// core functions; getLocalIpAndPort marks the 2025 API it drives;
// getNicLoadStats marks a library with the acknowledged TCP framing, v0.3.12
// on; newer functions optional), the mapping of Mooncake's task statuses and
// both sets of return codes (Status::Code and error.h), which links confirm
// application (RDMA; TCP only with v2 framing at both ends, from a library
// that has it), and its settings. The batch lifecycle and the verdicts are
// package nocancel's.
//
// It must never report a batch Succeeded on a COMPLETED that the link does
// not confirm (legacy TCP framing reports COMPLETED once bytes are queued)
// or after a submitTransfer that refused part-way (over RDMA slices may
// have left; never-posted tasks read COMPLETED on older engines), return
// an error from Post once submitTransfer was called,
// FailedDefinite on Mooncake's word (FAILED, TIMEOUT and WAITING writes
// land later: measured), free a batch before every task was polled terminal
// (batch ids are raw pointers; BatchBusy), release a source a FAILED task
// may still read, or declare Revoke or a bounded MaxTail.
//
// See README.md for what Mooncake promises, what it does not, and how
// kvfence keeps memory safe anyway.
package mooncake
