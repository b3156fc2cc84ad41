/*
 * kvfence's MORI-IO shim: the extern "C" interface (ABI 1) that
 * kvfence-plugin-mori loads at run time (KVFENCE_MORI_SHIM). MORI-IO has
 * only a C++ API; kvfence_mori_shim.cpp implements this interface over it.
 * This interface is kvfence's own. Every call returns 0 or a negative
 * error unless it says otherwise.
 */
#ifndef KVFENCE_MORI_SHIM_H
#define KVFENCE_MORI_SHIM_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define KVF_MORI_ABI 1

/* Per-op status codes: MORI's StatusCode values, passed through. */
enum { KVF_MORI_SUCCESS = 0, KVF_MORI_INIT = 1, KVF_MORI_IN_PROGRESS = 2 }; /* errors: > 10 */

int kvf_mori_abi(void); /* KVF_MORI_ABI */
/* Starts an IOEngine (out-of-band host:port, port 0 = any) with one backend
 * ("rdma"); NULL on failure, with a message in err. */
void *kvf_mori_open(const char *host, int port, const char *backend, char *err, size_t errlen);
int kvf_mori_name(void *engine, char *buf, size_t n);
/* The engine's descriptor and every registered memory descriptor,
 * serialised: what a peer loads to write here. *len is set; -1 if cap is
 * too small. */
int kvf_mori_metadata(void *engine, void *buf, size_t cap, size_t *len);
int kvf_mori_register(void *engine, uintptr_t addr, size_t len);
int kvf_mori_deregister(void *engine, uintptr_t addr);
/* Loads a peer's metadata (registers its engine, replaces its memory
 * descriptors); writes the peer's name. */
int kvf_mori_load_peer(void *engine, const void *md, size_t len, char *name, size_t n);
/* Starts n writes to peer (absolute remote addresses inside memory the peer
 * published). Returns a batch that owns one status per write, or NULL
 * (nothing was started) with *err set. */
void *kvf_mori_submit(void *engine, const char *peer, const uintptr_t *src, const uint64_t *dst, const uint64_t *len,
                      size_t n, int *err);
int kvf_mori_status(void *batch, size_t i); /* a status code above */
/* Frees the batch; 4 (busy) while any write is INIT or IN_PROGRESS: MORI
 * writes into the status until the transfer ends. */
int kvf_mori_free(void *batch);

#ifdef __cplusplus
}
#endif
#endif
