// Package nixl will hold the kvfence transport plugin that wraps NIXL.
//
// It owns the mapping of nixl_status_t results onto the kvfence completion
// contract. It must never treat releaseXferReq or a backend error as proof
// that writes stopped.
//
// Not built yet: a later issue fills this package.
package nixl
