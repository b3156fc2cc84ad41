/*
 * A fake of kvfence's own MORI shim interface (../shim/kvfence_mori_shim.h)
 * for the plugin's tests: no MORI, no GPU, no RDMA. Bytes move through the
 * shared fake data path (../../kit/nocancel/testdata/fakewire.h); a
 * write's status follows MORI's codes (SUCCESS 0, IN_PROGRESS 2, ERR_RDMA_OP
 * 13 after KVFENCE_FAKE_STATUS_TIMEOUT_MS while the bytes still land).
 * -DFAKE_ABI=N reports another interface version (the refusal test).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakewire.h"
#include "kvfence_mori_shim.h"

#ifndef FAKE_ABI
#define FAKE_ABI KVF_MORI_ABI
#endif
#define MAX_PEERS 64

struct engine {
	char name[64];
	struct fw_engine *w;
	char peers[MAX_PEERS][64], addrs[MAX_PEERS][64];
	int npeers;
};

int kvf_mori_abi(void) { return FAKE_ABI; }

void *kvf_mori_open(const char *host, int port, const char *backend, char *err, size_t errlen) {
	(void)port;
	if (strcmp(backend, "rdma") != 0) {
		snprintf(err, errlen, "backend %s not supported", backend);
		return NULL;
	}
	struct engine *e = calloc(1, sizeof *e);
	if (!(e->w = fw_start(host))) {
		snprintf(err, errlen, "listen failed");
		free(e);
		return NULL;
	}
	char where[48];
	fw_name(e->w, where, sizeof where);
	snprintf(e->name, sizeof e->name, "fake-mori-%s", where);
	return e;
}

int kvf_mori_name(void *engine, char *buf, size_t n) {
	struct engine *e = engine;
	return snprintf(buf, n, "%s", e->name) < (int)n ? 0 : -1;
}

/* Metadata: "name|host:port". */
int kvf_mori_metadata(void *engine, void *buf, size_t cap, size_t *len) {
	struct engine *e = engine;
	char where[48], tmp[128];
	fw_name(e->w, where, sizeof where);
	int n = snprintf(tmp, sizeof tmp, "%s|%s", e->name, where);
	*len = (size_t)n;
	if ((size_t)n > cap) return -1;
	memcpy(buf, tmp, (size_t)n);
	return 0;
}

int kvf_mori_register(void *engine, uintptr_t addr, size_t len) { return fw_register(((struct engine *)engine)->w, addr, len); }
int kvf_mori_deregister(void *engine, uintptr_t addr) { return fw_unregister(((struct engine *)engine)->w, addr) == 0 ? 0 : -2; }

int kvf_mori_load_peer(void *engine, const void *md, size_t len, char *name, size_t n) {
	struct engine *e = engine;
	char buf[128];
	if (len >= sizeof buf) return -1;
	memcpy(buf, md, len);
	buf[len] = 0;
	char *bar = strchr(buf, '|');
	if (!bar) return -1;
	*bar = 0;
	if (strlen(buf) >= 64 || strlen(bar + 1) >= 64 || strlen(buf) >= n) return -1;
	int i;
	for (i = 0; i < e->npeers && strcmp(e->peers[i], buf) != 0; i++) {}
	if (i == e->npeers) {
		if (e->npeers == MAX_PEERS) return -1;
		e->npeers++;
	}
	memcpy(e->peers[i], buf, strlen(buf) + 1);
	memcpy(e->addrs[i], bar + 1, strlen(bar + 1) + 1);
	memcpy(name, buf, strlen(buf) + 1);
	return 0;
}

void *kvf_mori_submit(void *engine, const char *peer, const uintptr_t *src, const uint64_t *dst, const uint64_t *len, size_t n,
                      int *err) {
	struct engine *e = engine;
	int i;
	for (i = 0; i < e->npeers && strcmp(e->peers[i], peer) != 0; i++) {}
	if (i == e->npeers) {
		*err = -2;
		return NULL;
	}
	struct fw_batch *b = fw_batch_new(n);
	for (size_t k = 0; k < n; k++)
		if (fw_batch_add(b, e->addrs[i], src[k], dst[k], len[k]) != 0) {
			fw_batch_free(b, 1);
			*err = -1;
			return NULL;
		}
	fw_batch_start(b);
	return b;
}

int kvf_mori_status(void *batch, size_t i) {
	int st;
	uint64_t bytes;
	if (fw_task_status(batch, i, &st, &bytes) != 0) return 12; /* ERR_NOT_FOUND */
	return st == FW_COMPLETED ? KVF_MORI_SUCCESS : st == FW_FAILED ? 13 /* ERR_RDMA_OP */ : KVF_MORI_IN_PROGRESS;
}

int kvf_mori_free(void *batch) { return fw_batch_free(batch, 0); }
