/*
 * A stand-in for Mooncake Transfer Engine's C API, written for kvfence's
 * tests from the API's documented signatures and the behaviours measured
 * against the real library. It really moves bytes between processes: each
 * engine listens on a loopback TCP port; a write is a connection that
 * carries a header {size, address, flags} and the payload, which the
 * target's server thread copies straight into the given address.
 *
 * Behaviours reproduced (each can be provoked by the tests):
 *  - registration is checked once, when a request starts (unregistering
 *    during a write does not stop it);
 *  - v2 framing: the server acknowledges after applying; legacy framing
 *    (MC_TCP_PROTO=1 at the initiator): COMPLETED once the bytes are sent;
 *  - a task not acknowledged within the status timeout (MC_TCP_STATUS_TIMEOUT_SEC,
 *    or KVFENCE_FAKE_MC_STATUS_TIMEOUT_MS) reads FAILED with transferred_bytes 0,
 *    while its sender thread goes on sending: the bytes land later;
 *  - writes of KVFENCE_FAKE_MC_WAIT_FOREVER_BYTES (default 4 MiB) or more
 *    have no status timeout: WAITING for as long as the target is stopped;
 *  - freeBatchID answers BatchBusy (4) until every task was polled terminal;
 *  - a batch id is a pointer.
 * Build flags for the refusal tests: -DFAKE_OLD_API hides getLocalIpAndPort,
 * -DFAKE_NO_SUBMIT hides submitTransfer (exported under another name).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef FAKE_OLD_API
#define getLocalIpAndPort fake_hidden_getLocalIpAndPort
#endif
#ifdef FAKE_NO_SUBMIT
#define submitTransfer fake_hidden_submitTransfer
#endif

enum { ST_WAITING = 0, ST_COMPLETED = 4, ST_FAILED = 6 };
enum { FLAG_V2 = 1 };
#define MAX_SEGS 256
#define MAX_REGS 1024

struct reg { uintptr_t addr; size_t len; };

struct fengine {
	int lfd, port;
	char host[64];
	pthread_mutex_t mu;
	char segs[MAX_SEGS][128];
	int nsegs;
	struct reg regs[MAX_REGS];
	int nregs;
};

struct task {
	int status;          /* what the sender thread observed */
	int polled_terminal; /* getTransferStatus returned a terminal status */
	int64_t deadline_ns; /* 0: no status timeout */
	uintptr_t src;
	uint64_t dst, len;
	char seg[128];
};

struct batch {
	struct fengine *e;
	pthread_mutex_t mu;
	size_t cap, n;
	int refs; /* the batch owner plus each running sender thread */
	struct task *tasks;
};

struct job { struct batch *b; size_t i; };

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t status_timeout_ns(void) {
	const char *ms = getenv("KVFENCE_FAKE_MC_STATUS_TIMEOUT_MS");
	if (ms && *ms) return atoll(ms) * 1000000LL;
	const char *s = getenv("MC_TCP_STATUS_TIMEOUT_SEC");
	return (s && *s ? atoll(s) : 30) * 1000000000LL;
}

static uint64_t wait_forever_bytes(void) {
	const char *v = getenv("KVFENCE_FAKE_MC_WAIT_FOREVER_BYTES");
	return v && *v ? strtoull(v, NULL, 10) : (4u << 20);
}

static int legacy(void) {
	const char *v = getenv("MC_TCP_PROTO");
	return v && strcmp(v, "1") == 0;
}

static int full_io(int fd, void *buf, size_t n, int sending) {
	char *p = buf;
	while (n > 0) {
		ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
		if (k < 0 && errno == EINTR) continue;
		if (k <= 0) return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static int registered(struct fengine *e, uint64_t addr, uint64_t len) {
	int ok = 0;
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < e->nregs; i++)
		if (addr >= e->regs[i].addr && len <= e->regs[i].len && addr - e->regs[i].addr <= e->regs[i].len - len) ok = 1;
	pthread_mutex_unlock(&e->mu);
	return ok;
}

/* The one engine of this process (the plugin creates one). */
static struct fengine *self_engine;

/* One write per connection: header, payload straight into the address. */
static void *serve_one(void *arg) {
	int fd = (int)(intptr_t)arg;
	uint64_t hdr[3];
	if (full_io(fd, hdr, sizeof hdr, 0) == 0) {
		uint64_t size = hdr[0], addr = hdr[1], flags = hdr[2];
		int ok = registered(self_engine, addr, size); /* checked once, at the start */
		if (ok) ok = full_io(fd, (void *)(uintptr_t)addr, size, 0) == 0;
		if (flags & FLAG_V2) {
			uint8_t ack = ok ? 0 : 1;
			full_io(fd, &ack, 1, 1);
		}
	}
	close(fd);
	return NULL;
}

static void *accept_loop(void *arg) {
	struct fengine *e = arg;
	for (;;) {
		int fd = accept(e->lfd, NULL, NULL);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED) continue;
			return NULL;
		}
		pthread_t th;
		pthread_create(&th, NULL, serve_one, (void *)(intptr_t)fd);
		pthread_detach(th);
	}
}

void *createTransferEngine(const char *meta, const char *name, const char *ip, uint64_t port, int auto_discover) {
	(void)meta; (void)name; (void)port; (void)auto_discover;
	struct fengine *e = calloc(1, sizeof *e);
	pthread_mutex_init(&e->mu, NULL);
	snprintf(e->host, sizeof e->host, "%s", ip && *ip ? ip : "127.0.0.1");
	e->lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	inet_pton(AF_INET, e->host, &sa.sin_addr);
	if (bind(e->lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(e->lfd, 128) < 0) {
		close(e->lfd);
		free(e);
		return NULL;
	}
	socklen_t sl = sizeof sa;
	getsockname(e->lfd, (struct sockaddr *)&sa, &sl);
	e->port = ntohs(sa.sin_port);
	self_engine = e;
	pthread_t th;
	pthread_create(&th, NULL, accept_loop, e);
	pthread_detach(th);
	return e;
}

int getLocalIpAndPort(void *engine, char *buf, size_t n) {
	struct fengine *e = engine;
	return snprintf(buf, n, "%s:%d", e->host, e->port) < (int)n ? 0 : -1;
}

void *installTransport(void *engine, const char *proto, void **args) {
	(void)args;
	return proto && strcmp(proto, "tcp") == 0 ? engine : NULL;
}

int32_t openSegment(void *engine, const char *name) {
	struct fengine *e = engine;
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < e->nsegs; i++)
		if (strcmp(e->segs[i], name) == 0) { pthread_mutex_unlock(&e->mu); return i + 1; }
	if (e->nsegs == MAX_SEGS || strlen(name) >= 128 || !strchr(name, ':')) { pthread_mutex_unlock(&e->mu); return -1; }
	snprintf(e->segs[e->nsegs], 128, "%s", name);
	int id = ++e->nsegs;
	pthread_mutex_unlock(&e->mu);
	return id;
}

int registerLocalMemory(void *engine, void *addr, size_t len, const char *loc, int remote) {
	(void)loc; (void)remote;
	struct fengine *e = engine;
	pthread_mutex_lock(&e->mu);
	int rc = e->nregs == MAX_REGS ? 2 : 0;
	if (rc == 0) e->regs[e->nregs++] = (struct reg){(uintptr_t)addr, len};
	pthread_mutex_unlock(&e->mu);
	return rc;
}

int unregisterLocalMemory(void *engine, void *addr) {
	struct fengine *e = engine;
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < e->nregs; i++)
		if (e->regs[i].addr == (uintptr_t)addr) {
			e->regs[i] = e->regs[--e->nregs];
			pthread_mutex_unlock(&e->mu);
			return 0;
		}
	pthread_mutex_unlock(&e->mu);
	return 3;
}

uint64_t allocateBatchID(void *engine, size_t n) {
	struct batch *b = calloc(1, sizeof *b);
	b->e = engine;
	b->cap = n;
	b->refs = 1;
	b->tasks = calloc(n ? n : 1, sizeof *b->tasks);
	pthread_mutex_init(&b->mu, NULL);
	return (uint64_t)(uintptr_t)b;
}

static void unref(struct batch *b) {
	pthread_mutex_lock(&b->mu);
	int last = --b->refs == 0;
	pthread_mutex_unlock(&b->mu);
	if (last) {
		free(b->tasks);
		free(b);
	}
}

static void finish(struct batch *b, size_t i, int st) {
	pthread_mutex_lock(&b->mu);
	if (b->tasks[i].status == ST_WAITING) b->tasks[i].status = st;
	pthread_mutex_unlock(&b->mu);
}

static void *send_one(void *arg) {
	struct job *j = arg;
	struct batch *b = j->b;
	size_t i = j->i;
	free(j);
	struct task t;
	pthread_mutex_lock(&b->mu);
	t = b->tasks[i];
	pthread_mutex_unlock(&b->mu);
	char host[128];
	snprintf(host, sizeof host, "%s", t.seg);
	char *colon = strrchr(host, ':');
	*colon = 0;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
	inet_pton(AF_INET, host, &sa.sin_addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int v2 = !legacy();
	uint64_t hdr[3] = {t.len, t.dst, v2 ? FLAG_V2 : 0};
	int st = ST_FAILED;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && full_io(fd, hdr, sizeof hdr, 1) == 0 &&
	    full_io(fd, (void *)t.src, t.len, 1) == 0) {
		if (!v2) {
			st = ST_COMPLETED; /* sent is all legacy framing knows */
			finish(b, i, st);
			uint8_t drain;
			recv(fd, &drain, 1, 0); /* keep the connection until the server is done */
		} else {
			uint8_t ack = 1;
			if (full_io(fd, &ack, 1, 0) == 0 && ack == 0) st = ST_COMPLETED;
		}
	}
	close(fd);
	finish(b, i, st);
	unref(b);
	return NULL;
}

int submitTransfer(void *engine, uint64_t batch_id, void *entries, size_t count) {
	struct fengine *e = engine;
	struct batch *b = (struct batch *)(uintptr_t)batch_id;
	struct req { int opcode; void *source; int32_t target_id; uint32_t file_id; uint64_t target_offset; uint64_t length; } *r = entries;
	if (b->n + count > b->cap) return 2;
	for (size_t k = 0; k < count; k++) {
		if (r[k].opcode != 1) return 1;
		pthread_mutex_lock(&e->mu);
		int ok = r[k].target_id >= 1 && r[k].target_id <= e->nsegs;
		pthread_mutex_unlock(&e->mu);
		if (!ok) return 1;
	}
	int64_t timeout = status_timeout_ns();
	uint64_t forever = wait_forever_bytes();
	for (size_t k = 0; k < count; k++) {
		size_t i = b->n++;
		struct task *t = &b->tasks[i];
		t->src = (uintptr_t)r[k].source;
		t->dst = r[k].target_offset;
		t->len = r[k].length;
		t->deadline_ns = t->len >= forever ? 0 : now_ns() + timeout;
		pthread_mutex_lock(&e->mu);
		snprintf(t->seg, sizeof t->seg, "%s", e->segs[r[k].target_id - 1]);
		pthread_mutex_unlock(&e->mu);
		struct job *j = malloc(sizeof *j);
		j->b = b;
		j->i = i;
		pthread_mutex_lock(&b->mu);
		b->refs++;
		pthread_mutex_unlock(&b->mu);
		pthread_t th;
		pthread_create(&th, NULL, send_one, j);
		pthread_detach(th);
	}
	return 0;
}

int getTransferStatus(void *engine, uint64_t batch_id, size_t task, void *out) {
	(void)engine;
	struct batch *b = (struct batch *)(uintptr_t)batch_id;
	struct { int status; uint64_t transferred_bytes; } *s = out;
	pthread_mutex_lock(&b->mu);
	if (task >= b->n) { pthread_mutex_unlock(&b->mu); return 1; }
	struct task *t = &b->tasks[task];
	if (t->status == ST_WAITING && t->deadline_ns && now_ns() > t->deadline_ns) t->status = ST_FAILED;
	s->status = t->status;
	s->transferred_bytes = t->status == ST_COMPLETED ? t->len : 0;
	if (t->status != ST_WAITING) t->polled_terminal = 1;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

int freeBatchID(void *engine, uint64_t batch_id) {
	(void)engine;
	struct batch *b = (struct batch *)(uintptr_t)batch_id;
	pthread_mutex_lock(&b->mu);
	for (size_t i = 0; i < b->n; i++)
		if (!b->tasks[i].polled_terminal) { pthread_mutex_unlock(&b->mu); return 4; }
	pthread_mutex_unlock(&b->mu);
	unref(b);
	return 0;
}
