// Package nixl is the kvfence transport plugin over NIXL's C API
// (libnixl_capi.so, the library NIXL's Rust bindings load) with its UCX
// backend, loaded at run time with dlopen/dlsym: the plugin builds and its
// tests run without NIXL, and without the library it refuses its handshake
// with one classified line naming KVFENCE_NIXL_LIB.
//
// It owns: the library's symbols and its C API layout (chosen by
// nixl_capi_get_version where the library has it, else NIXL 8770b655's;
// any other version refused), the prototypes it calls (kvf_nixl_capi.h),
// the agent (one call into it at a time; a progress thread that sleeps
// between polls) and its UCX backend, the metadata exchange (served through the
// key directory of package nocancel), the mapping of transfer-request
// statuses, and the refusal of UCX transports by which the initiator
// writes the target's memory itself (shared memory, CMA, XPMEM, KNEM, GPU
// IPC): ending the target process does not fence those.
//
// It must never take releaseXferReq for a cancel (measured: every byte
// landed after it returned), an error status for proof that bytes stopped
// (the C API folds disconnects and cancels into ERROR_BACKEND), or a
// deregistration for a revocation (measured: a deregistered buffer still
// received a write reported SUCCESS); never release a request before it
// reached a terminal status, free a returned buffer other than as its API
// version says, drop a post's result unlogged, and never declare Revoke or
// a bounded MaxTail.
package nixl
