/*
 * A stand-in for NIXL's C API (libnixl_capi.so), written for kvfence's
 * tests from the API's documented signatures: only the calls the plugin
 * makes. The bytes move through the shared fake data path
 * (../../kit/nocancel/testdata/fakewire.h). Behaviours reproduced:
 * a request to a stopped target stays IN_PROG with no timeout (unless
 * KVFENCE_FAKE_STATUS_TIMEOUT_MS turns a stall into ERROR_BACKEND while the
 * bytes still land later); release_xfer_req returns success in flight and
 * does not stop the transfer; deregistration is checked once per write.
 * -DFAKE_NO_STATUS hides nixl_capi_get_xfer_status (the refusal test).
 * Like the real agent made with thread sync NONE (nixl_capi_create_agent's
 * default), it is not safe to enter from two threads at once: with
 * KVFENCE_FAKE_ONE_CALLER set, two threads inside an agent call abort the
 * process. nixl_capi_create_configured_agent refuses a configuration
 * other than the one the plugin must ask for (progress thread, a non-zero
 * progress delay: 0 makes the real progress thread spin a core, and
 * thread sync STRICT).
 *
 * Every definition is checked against the plugin's own declarations
 * (../kvf_nixl_capi.h). By default it is NIXL 8770b655's unversioned C API.
 * -DFAKE_CAPI_V01 makes it the versioned API: nixl_capi_get_version
 * reports FAKE_CAPI_MAJOR.FAKE_CAPI_MINOR.FAKE_CAPI_PATCH (default 0.1.0),
 * the agent configuration has the 0.1 layout (uint16_t listen_port at 2,
 * thread_sync at 4: a caller that writes the 8770b655 layout reads as sync
 * NONE, which it refuses), and the buffers it returns come from its own
 * allocator, released only by nixl_capi_mem_free: a plain free() of one
 * aborts the process. KVFENCE_FAKE_POST_FAIL=1 makes post_xfer_req start
 * the transfer and still return ERROR_BACKEND.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FAKE_CAPI_V01
#define KVF_NX_AGENT_CONFIG struct kvf_nx_agent_config_v01
#endif
#include "../kvf_nixl_capi.h"
#include "fakewire.h"

#ifndef FAKE_CAPI_MAJOR
#define FAKE_CAPI_MAJOR 0
#endif
#ifndef FAKE_CAPI_MINOR
#define FAKE_CAPI_MINOR 1
#endif
#ifndef FAKE_CAPI_PATCH
#define FAKE_CAPI_PATCH 0
#endif

#ifdef FAKE_CAPI_V01
void nixl_capi_get_version(int *major, int *minor, int *patch) {
	if (major) *major = FAKE_CAPI_MAJOR;
	if (minor) *minor = FAKE_CAPI_MINOR;
	if (patch) *patch = FAKE_CAPI_PATCH;
}
/* The library's own allocator: the pointer it hands out is 16 bytes into
 * its block, and the word before it is a chunk size glibc's free() rejects
 * (mmapped, misaligned), so a caller that frees it with free() aborts. */
static void *lib_alloc(size_t n) {
	uint64_t *blk = malloc(n + 16);
	blk[0] = 0x6b76666e69786c; /* "kvfnixl" */
	blk[1] = 0x3;
	return blk + 2;
}
void nixl_capi_mem_free(void *p) {
	if (p) free((uint64_t *)p - 2);
}
#else
static void *lib_alloc(size_t n) { return malloc(n); }
#endif

#ifdef FAKE_NO_STATUS
#define nixl_capi_get_xfer_status fake_hidden_get_xfer_status
#endif

enum { OK = 0, IN_PROG = 1, INVALID_PARAM = -1, BACKEND = -2 };
#define MAX_PEERS 64
#define MAX_DESCS 4096

struct agent {
	char name[64];
	struct fw_engine *w;
	char peers[MAX_PEERS][64], addrs[MAX_PEERS][64];
	int npeers;
};
struct dlist { size_t n; uintptr_t addr[MAX_DESCS]; size_t len[MAX_DESCS]; };
struct req { struct fw_batch *b; int released; };

/* One caller at a time, checked: the window is widened so overlaps show. */
static atomic_int inside;
static void enter(void) {
	if (!getenv("KVFENCE_FAKE_ONE_CALLER")) return;
	if (atomic_fetch_add(&inside, 1) != 0) {
		fprintf(stderr, "fake nixl: two threads inside the agent at once (thread sync NONE)\n");
		abort();
	}
	usleep(200);
}
static void leave(void) {
	if (getenv("KVFENCE_FAKE_ONE_CALLER")) atomic_fetch_sub(&inside, 1);
}

int nixl_capi_create_agent(const char *name, void **out) {
	struct agent *a = calloc(1, sizeof *a);
	snprintf(a->name, sizeof a->name, "%s", name);
	if (!getenv("KVFENCE_FAKE_STATUS_TIMEOUT_MS")) setenv("KVFENCE_FAKE_STATUS_TIMEOUT_MS", "0", 1); /* NIXL has no timeout */
	if (!(a->w = fw_start("127.0.0.1"))) return BACKEND;
	*out = a;
	return OK;
}

int nixl_capi_create_configured_agent(const char *name, const KVF_NX_AGENT_CONFIG *c, void **out) {
	if (!c->enable_prog_thread || c->enable_listen_thread || c->pthr_delay_us == 0 || c->thread_sync != 1) {
		fprintf(stderr, "fake nixl: refused agent config (prog %d listen %d delay %llu sync %d)\n", c->enable_prog_thread,
		        c->enable_listen_thread, (unsigned long long)c->pthr_delay_us, c->thread_sync);
		return INVALID_PARAM;
	}
	return nixl_capi_create_agent(name, out);
}

int nixl_capi_get_plugin_params(void *a, const char *plugin, void **mems, void **params) {
	(void)a;
	if (strcmp(plugin, "UCX") != 0) return INVALID_PARAM;
	*mems = malloc(1);
	*params = malloc(1);
	return OK;
}
int nixl_capi_create_backend(void *a, const char *plugin, void *params, void **out) {
	(void)params;
	*out = a;
	return strcmp(plugin, "UCX") == 0 ? OK : INVALID_PARAM;
}
int nixl_capi_destroy_mem_list(void *p) { free(p); return OK; }
int nixl_capi_destroy_params(void *p) { free(p); return OK; }
int nixl_capi_create_opt_args(void **out) { *out = malloc(1); return OK; }
int nixl_capi_opt_args_add_backend(void *o, void *b) { (void)o; (void)b; return OK; }

static int new_dlist(void **out) { *out = calloc(1, sizeof(struct dlist)); return OK; }
static int add_desc(void *d, uintptr_t addr, size_t len) {
	struct dlist *l = d;
	if (l->n == MAX_DESCS) return INVALID_PARAM;
	l->addr[l->n] = addr;
	l->len[l->n++] = len;
	return OK;
}
int nixl_capi_create_reg_dlist(int type, void **out) { (void)type; return new_dlist(out); }
int nixl_capi_reg_dlist_add_desc(void *d, uintptr_t addr, size_t len, uint64_t dev, const void *md, size_t mdlen) {
	(void)dev; (void)md; (void)mdlen;
	return add_desc(d, addr, len);
}
int nixl_capi_destroy_reg_dlist(void *d) { free(d); return OK; }
int nixl_capi_create_xfer_dlist(int type, void **out) { (void)type; return new_dlist(out); }
int nixl_capi_xfer_dlist_add_desc(void *d, uintptr_t addr, size_t len, uint64_t dev) { (void)dev; return add_desc(d, addr, len); }
int nixl_capi_destroy_xfer_dlist(void *d) { free(d); return OK; }

static int fake_register_mem_impl(void *ag, void *d, void *o) {
	(void)o;
	struct agent *a = ag;
	struct dlist *l = d;
	for (size_t i = 0; i < l->n; i++)
		if (fw_register(a->w, l->addr[i], l->len[i]) != 0) return BACKEND;
	return OK;
}
static int fake_deregister_mem_impl(void *ag, void *d, void *o) {
	(void)o;
	struct agent *a = ag;
	struct dlist *l = d;
	for (size_t i = 0; i < l->n; i++)
		if (fw_unregister(a->w, l->addr[i]) != 0) return INVALID_PARAM;
	return OK;
}

/* Metadata: "name|host:port". */
static int fake_get_local_md_impl(void *ag, void **data, size_t *len) {
	struct agent *a = ag;
	char where[64], buf[160];
	fw_name(a->w, where, sizeof where);
	int n = snprintf(buf, sizeof buf, "%s|%s", a->name, where);
	*data = lib_alloc(n);
	memcpy(*data, buf, n);
	*len = n;
	return OK;
}
static int fake_load_remote_md_impl(void *ag, const void *data, size_t len, char **name) {
	struct agent *a = ag;
	char buf[160];
	if (len >= sizeof buf) return INVALID_PARAM;
	memcpy(buf, data, len);
	buf[len] = 0;
	char *bar = strchr(buf, '|');
	if (!bar) return INVALID_PARAM;
	*bar = 0;
	if (strlen(buf) >= 64 || strlen(bar + 1) >= 64) return INVALID_PARAM;
	int i;
	for (i = 0; i < a->npeers && strcmp(a->peers[i], buf) != 0; i++) {}
	if (i == a->npeers) {
		if (a->npeers == MAX_PEERS) return BACKEND;
		a->npeers++;
	}
	memcpy(a->peers[i], buf, strlen(buf) + 1);
	memcpy(a->addrs[i], bar + 1, strlen(bar + 1) + 1);
	*name = lib_alloc(strlen(buf) + 1);
	memcpy(*name, buf, strlen(buf) + 1);
	return OK;
}

static int fake_create_xfer_req_impl(void *ag, int op, void *local, void *remote, const char *peer, void **out, void *o) {
	(void)o;
	struct agent *a = ag;
	struct dlist *l = local, *r = remote;
	if (op != 1 || l->n != r->n) return INVALID_PARAM;
	int i;
	for (i = 0; i < a->npeers && strcmp(a->peers[i], peer) != 0; i++) {}
	if (i == a->npeers) return INVALID_PARAM; /* metadata not loaded */
	struct req *q = calloc(1, sizeof *q);
	q->b = fw_batch_new(l->n);
	for (size_t k = 0; k < l->n; k++) {
		if (l->len[k] != r->len[k] || fw_batch_add(q->b, a->addrs[i], l->addr[k], r->addr[k], l->len[k]) != 0) {
			fw_batch_free(q->b, 1);
			free(q);
			return INVALID_PARAM;
		}
	}
	*out = q;
	return OK;
}

static int fake_post_xfer_req_impl(void *ag, void *rq, void *o) {
	(void)ag; (void)o;
	fw_batch_start(((struct req *)rq)->b);
	return getenv("KVFENCE_FAKE_POST_FAIL") ? BACKEND : IN_PROG;
}

static int fake_get_xfer_status_impl(void *ag, void *rq) {
	(void)ag;
	struct req *q = rq;
	int done = 1;
	for (size_t i = 0; i < fw_batch_len(q->b); i++) {
		int st;
		uint64_t bytes;
		fw_task_status(q->b, i, &st, &bytes);
		if (st == FW_FAILED) return BACKEND;
		if (st != FW_COMPLETED) done = 0;
	}
	return done ? OK : IN_PROG;
}

/* Release is not cancel: the senders go on. */
static int fake_release_xfer_req_impl(void *ag, void *rq) {
	(void)ag;
	struct req *q = rq;
	if (!q->released) fw_batch_free(q->b, 1);
	q->released = 1;
	return OK;
}
int nixl_capi_destroy_xfer_req(void *rq) { free(rq); return OK; }

int nixl_capi_register_mem(void *ag, void *d, void *o) {
	enter();
	int rc = fake_register_mem_impl(ag, d, o);
	leave();
	return rc;
}

int nixl_capi_deregister_mem(void *ag, void *d, void *o) {
	enter();
	int rc = fake_deregister_mem_impl(ag, d, o);
	leave();
	return rc;
}

int nixl_capi_get_local_md(void *ag, void **data, size_t *len) {
	enter();
	int rc = fake_get_local_md_impl(ag, data, len);
	leave();
	return rc;
}

int nixl_capi_load_remote_md(void *ag, const void *data, size_t len, char **name) {
	enter();
	int rc = fake_load_remote_md_impl(ag, data, len, name);
	leave();
	return rc;
}

int nixl_capi_create_xfer_req(void *ag, int op, void *local, void *remote, const char *peer, void **out, void *o) {
	enter();
	int rc = fake_create_xfer_req_impl(ag, op, local, remote, peer, out, o);
	leave();
	return rc;
}

int nixl_capi_post_xfer_req(void *ag, void *rq, void *o) {
	enter();
	int rc = fake_post_xfer_req_impl(ag, rq, o);
	leave();
	return rc;
}

int nixl_capi_get_xfer_status(void *ag, void *rq) {
	enter();
	int rc = fake_get_xfer_status_impl(ag, rq);
	leave();
	return rc;
}

int nixl_capi_release_xfer_req(void *ag, void *rq) {
	enter();
	int rc = fake_release_xfer_req_impl(ag, rq);
	leave();
	return rc;
}
