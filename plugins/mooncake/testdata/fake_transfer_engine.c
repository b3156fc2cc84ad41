/*
 * A stand-in for Mooncake Transfer Engine's C API, written for kvfence's
 * tests from the API's documented signatures; the bytes move through the
 * shared fake data path (../../kit/nocancel/testdata/fakewire.h),
 * which reproduces Mooncake's measured TCP behaviours: FAILED after
 * MC_TCP_STATUS_TIMEOUT_SEC (or KVFENCE_FAKE_STATUS_TIMEOUT_MS) while the
 * bytes still land, WAITING forever for large writes, transferred_bytes 0
 * on failure, legacy framing with MC_TCP_PROTO=1, registration checked once
 * per request. Batch ids are pointers; freeBatchID answers BatchBusy (4)
 * until every task was polled terminal.
 *
 * -DFAKE_OLD_API hides getLocalIpAndPort, -DFAKE_NO_SUBMIT hides
 * submitTransfer (each exported under another name): the refusal tests.
 * -DFAKE_LEGACY is a library older than Mooncake v0.3.12: no
 * getNicLoadStats, and its TCP speaks only the legacy framing (COMPLETED
 * once sent).
 *
 * installTransport takes "rdma" as well as "tcp" (the same loopback wire,
 * acknowledged), so that RDMA-only behaviours can be reproduced:
 * KVFENCE_FAKE_SUBMIT_FAIL_AFTER=k makes submitTransfer send the first k
 * writes of a batch and then refuse with AddressNotRegistered (3), as
 * RdmaTransport::submitTransferTask does once it posted slices at its
 * submit watermark and a later slice has no registered device; the tasks
 * it never posted read COMPLETED, as an older engine's do (slice count 0).
 * KVFENCE_FAKE_SUBMIT_GATE=path: submitTransfer blocks until path exists,
 * then submits: Mooncake's TCP transport (connection pool off, its
 * default) connects to the peer synchronously inside submitTransfer, so a
 * blackholed link holds the call for the kernel's SYN retries (measured
 * with the real library under two-host conformance's link-dropped).
 * KVFENCE_FAKE_STATUS_FAIL_FIRST=n: the first n getTransferStatus calls of
 * the process fail (rc 1) without a status.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakewire.h"

#ifdef FAKE_OLD_API
#define getLocalIpAndPort fake_hidden_getLocalIpAndPort
#endif
#ifdef FAKE_LEGACY
#define getNicLoadStats fake_hidden_getNicLoadStats
#endif
#ifdef FAKE_NO_SUBMIT
#define submitTransfer fake_hidden_submitTransfer
#endif

#define MAX_SEGS 256

struct fengine {
	struct fw_engine *w;
	char segs[MAX_SEGS][128];
	int nsegs;
};

struct request { int opcode; void *source; int32_t target_id; uint64_t target_offset; uint64_t length; };
struct status { int status; uint64_t transferred_bytes; };

void *createTransferEngine(const char *meta, const char *name, const char *ip, uint64_t port, int auto_discover) {
	(void)meta; (void)name; (void)port; (void)auto_discover;
	if (getenv("KVFENCE_FAKE_STDOUT_NOISE")) { /* as UCX's default log does */
		printf("fake transfer engine: a line on stdout\n");
		fflush(stdout);
	}
	if (!getenv("KVFENCE_FAKE_STATUS_TIMEOUT_MS") && getenv("MC_TCP_STATUS_TIMEOUT_SEC")) {
		char ms[32];
		snprintf(ms, sizeof ms, "%lld", atoll(getenv("MC_TCP_STATUS_TIMEOUT_SEC")) * 1000);
		setenv("KVFENCE_FAKE_STATUS_TIMEOUT_MS", ms, 1);
	}
#ifdef FAKE_LEGACY
	setenv("MC_TCP_PROTO", "1", 1); /* the only framing this library has */
#endif
	struct fengine *e = calloc(1, sizeof *e);
	if (!(e->w = fw_start(ip))) {
		free(e);
		return NULL;
	}
	return e;
}

int getLocalIpAndPort(void *engine, char *buf, size_t n) { return fw_name(((struct fengine *)engine)->w, buf, n); }

/* Present from v0.3.12 (with the acknowledged framing); the plugin only
 * looks it up. */
int getNicLoadStats(void *engine, void *stats, size_t n) {
	(void)engine; (void)stats; (void)n;
	return 0;
}

void *installTransport(void *engine, const char *proto, void **args) {
	(void)args;
	return proto && (strcmp(proto, "tcp") == 0 || strcmp(proto, "rdma") == 0) ? engine : NULL;
}

int32_t openSegment(void *engine, const char *name) {
	struct fengine *e = engine;
	for (int i = 0; i < e->nsegs; i++)
		if (strcmp(e->segs[i], name) == 0) return i + 1;
	if (e->nsegs == MAX_SEGS || strlen(name) >= 128 || !strchr(name, ':')) return -1;
	snprintf(e->segs[e->nsegs], 128, "%s", name);
	return ++e->nsegs;
}

int registerLocalMemory(void *engine, void *addr, size_t len, const char *loc, int remote) {
	(void)loc; (void)remote;
	return fw_register(((struct fengine *)engine)->w, (uintptr_t)addr, len) == 0 ? 0 : 2;
}

int unregisterLocalMemory(void *engine, void *addr) {
	return fw_unregister(((struct fengine *)engine)->w, (uintptr_t)addr) == 0 ? 0 : 3;
}

uint64_t allocateBatchID(void *engine, size_t n) {
	(void)engine;
	return (uint64_t)(uintptr_t)fw_batch_new(n);
}

int submitTransfer(void *engine, uint64_t batch_id, struct request *r, size_t count) {
	struct fengine *e = engine;
	struct fw_batch *b = (struct fw_batch *)(uintptr_t)batch_id;
	for (size_t k = 0; k < count; k++)
		if (r[k].opcode != 1 || r[k].target_id < 1 || r[k].target_id > e->nsegs) return 1;
	const char *gate = getenv("KVFENCE_FAKE_SUBMIT_GATE");
	while (gate && *gate && access(gate, F_OK) != 0) usleep(10000);
	const char *after = getenv("KVFENCE_FAKE_SUBMIT_FAIL_AFTER");
	size_t sent = after && *after ? (size_t)atoll(after) : count;
	if (sent > count) sent = count;
	for (size_t k = 0; k < sent; k++)
		if (fw_batch_add(b, e->segs[r[k].target_id - 1], (uintptr_t)r[k].source, r[k].target_offset, r[k].length) != 0) return 2;
	fw_batch_start(b);
	if (sent == count) return 0;
	for (size_t k = sent; k < count; k++) fw_batch_add_unsent(b, FW_COMPLETED);
	return 3; /* AddressNotRegistered, after the first writes left */
}

int getTransferStatus(void *engine, uint64_t batch_id, size_t task, struct status *s) {
	(void)engine;
	static int64_t calls;
	const char *fail = getenv("KVFENCE_FAKE_STATUS_FAIL_FIRST");
	if (fail && __atomic_fetch_add(&calls, 1, __ATOMIC_SEQ_CST) < atoll(fail)) return 1;
	int st;
	uint64_t bytes;
	if (fw_task_status((struct fw_batch *)(uintptr_t)batch_id, task, &st, &bytes) != 0) return 1;
	s->status = st; /* FW_* use Mooncake's numbers */
	s->transferred_bytes = bytes;
	return 0;
}

int freeBatchID(void *engine, uint64_t batch_id) {
	(void)engine;
	return fw_batch_free((struct fw_batch *)(uintptr_t)batch_id, 0);
}
