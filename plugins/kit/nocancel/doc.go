// Package nocancel (part of the public vendor kit, see plugins/kit) is a
// kvfence transport over a vendor backend that can
// neither cancel a posted write nor revoke a peer's access (Mooncake, NIXL,
// MORI-IO). The vendor plugins supply a Backend (their dlopen binding) and a
// status table; this package owns everything the contract asks on top.
//
// It owns: mapping host memory and registering it with the backend; Grant
// (a key names a window; peers resolve keys through a small directory
// listener of this process, because the backends address remote memory by
// absolute virtual address and no C call lists a peer's buffers); the batch
// lifecycle (submit, poll every task to a terminal state, free only then);
// the honest verdict of a batch (Verdict, pure Go); Quiesce with evidence
// only for batches every task of which confirmed its bytes applied.
//
// It must never: free a backend batch or release a source region before
// every task of it reached a terminal status; release the source of a task
// that ended in anything but a confirmed completion (the backend may still
// read it); report Succeeded where the backend does not confirm that the
// target applied the bytes; report FailedDefinite on the backend's word
// (a submit refused before the library's submit call is returned from
// Post, nothing having moved; one the library refused after it began is
// kept, its sources pinned, and reported InDoubt: SubmitRefused); free a
// batch on a failed status read; hold its lock across a backend's submit
// call (a library may block in it: the batch is reported InDoubt at its
// report deadline all the same, Post then returns it accepted, and it
// stays live until the call returns);
// offer Revoke, or deregister target memory that still has keys on it.
// The exceptions are the failed-is-definite and succeed-early-after:N
// variants (unsafe_verdict.go), selected only with -tags kvfenceunsafe so
// the tests can show they catch them.
//
// It also holds what the vendor plugins share around the transport
// (vendor.go: their limits, unbounded tail and environment parsing).
package nocancel
