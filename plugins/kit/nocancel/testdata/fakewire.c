/* See fakewire.h. Written for kvfence's tests. */
#include "fakewire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FW_MAX_REGS 1024
enum { FLAG_V2 = 1 };

struct reg { uintptr_t addr; size_t len; };

struct fw_engine {
	int lfd, port;
	char host[64];
	pthread_mutex_t mu;
	struct reg regs[FW_MAX_REGS];
	int nregs;
};

struct task {
	int status, polled_terminal;
	int64_t deadline_ns; /* 0: no status timeout */
	uintptr_t src;
	uint64_t dst, len;
	char peer[128];
};

struct fw_batch {
	pthread_mutex_t mu;
	size_t cap, n, started;
	int refs; /* the owner plus each running sender */
	struct task *tasks;
};

struct job { struct fw_batch *b; size_t i; };

static struct fw_engine *self_engine; /* one engine per process */

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t env_ll(const char *k, int64_t def) {
	const char *v = getenv(k);
	return v && *v ? atoll(v) : def;
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

static int registered(struct fw_engine *e, uint64_t addr, uint64_t len) {
	int ok = 0;
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < e->nregs; i++)
		if (addr >= e->regs[i].addr && len <= e->regs[i].len && addr - e->regs[i].addr <= e->regs[i].len - len) ok = 1;
	pthread_mutex_unlock(&e->mu);
	return ok;
}

static void *serve_one(void *arg) {
	int fd = (int)(intptr_t)arg;
	uint64_t hdr[3];
	if (full_io(fd, hdr, sizeof hdr, 0) == 0) {
		int ok = registered(self_engine, hdr[1], hdr[0]); /* checked once, at the start */
		if (ok) ok = full_io(fd, (void *)(uintptr_t)hdr[1], hdr[0], 0) == 0;
		if (hdr[2] & FLAG_V2) {
			uint8_t ack = ok ? 0 : 1;
			full_io(fd, &ack, 1, 1);
		}
	}
	close(fd);
	return NULL;
}

static void *accept_loop(void *arg) {
	struct fw_engine *e = arg;
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

struct fw_engine *fw_start(const char *host) {
	struct fw_engine *e = calloc(1, sizeof *e);
	pthread_mutex_init(&e->mu, NULL);
	snprintf(e->host, sizeof e->host, "%s", host && *host ? host : "127.0.0.1");
	e->lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	inet_pton(AF_INET, e->host, &sa.sin_addr);
	if (bind(e->lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(e->lfd, 4096) < 0) {
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

int fw_name(struct fw_engine *e, char *buf, size_t n) {
	return snprintf(buf, n, "%s:%d", e->host, e->port) < (int)n ? 0 : -1;
}

int fw_register(struct fw_engine *e, uintptr_t addr, size_t len) {
	pthread_mutex_lock(&e->mu);
	int rc = e->nregs == FW_MAX_REGS ? -1 : 0;
	if (rc == 0) e->regs[e->nregs++] = (struct reg){addr, len};
	pthread_mutex_unlock(&e->mu);
	return rc;
}

int fw_unregister(struct fw_engine *e, uintptr_t addr) {
	pthread_mutex_lock(&e->mu);
	for (int i = 0; i < e->nregs; i++)
		if (e->regs[i].addr == addr) {
			e->regs[i] = e->regs[--e->nregs];
			pthread_mutex_unlock(&e->mu);
			return 0;
		}
	pthread_mutex_unlock(&e->mu);
	return -1;
}

struct fw_batch *fw_batch_new(size_t cap) {
	struct fw_batch *b = calloc(1, sizeof *b);
	b->cap = cap;
	b->refs = 1;
	b->tasks = calloc(cap ? cap : 1, sizeof *b->tasks);
	pthread_mutex_init(&b->mu, NULL);
	return b;
}

static void unref(struct fw_batch *b) {
	pthread_mutex_lock(&b->mu);
	int last = --b->refs == 0;
	pthread_mutex_unlock(&b->mu);
	if (last) {
		free(b->tasks);
		free(b);
	}
}

static void finish(struct fw_batch *b, size_t i, int st) {
	pthread_mutex_lock(&b->mu);
	if (b->tasks[i].status == FW_WAITING) b->tasks[i].status = st;
	pthread_mutex_unlock(&b->mu);
}

/* Like a real engine's worker pool, at most FW_SENDERS tasks are on the
 * wire at once: a thread and a connection per task for a 1024-op batch
 * overflowed the listener and failed tasks on a healthy link. */
#define FW_SENDERS 32
static pthread_mutex_t senders_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t senders_cv = PTHREAD_COND_INITIALIZER;
static int senders;

static void *send_one(void *arg) {
	pthread_mutex_lock(&senders_mu);
	while (senders == FW_SENDERS) pthread_cond_wait(&senders_cv, &senders_mu);
	senders++;
	pthread_mutex_unlock(&senders_mu);
	void *send_task(struct job *);
	send_task(arg);
	pthread_mutex_lock(&senders_mu);
	senders--;
	pthread_cond_signal(&senders_cv);
	pthread_mutex_unlock(&senders_mu);
	return NULL;
}

void *send_task(struct job *arg) {
	struct job *j = arg;
	struct fw_batch *b = j->b;
	size_t i = j->i;
	free(j);
	pthread_mutex_lock(&b->mu);
	struct task t = b->tasks[i];
	pthread_mutex_unlock(&b->mu);
	char *colon = strrchr(t.peer, ':');
	*colon = 0;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(colon + 1))};
	inet_pton(AF_INET, t.peer, &sa.sin_addr);
	const char *proto = getenv("MC_TCP_PROTO");
	int v2 = !(proto && strcmp(proto, "1") == 0);
	uint64_t hdr[3] = {t.len, t.dst, v2 ? FLAG_V2 : 0};
	int st = FW_FAILED;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && full_io(fd, hdr, sizeof hdr, 1) == 0 &&
	    full_io(fd, (void *)t.src, t.len, 1) == 0) {
		if (!v2) {
			st = FW_COMPLETED; /* sent is all legacy framing knows */
			finish(b, i, st);
			uint8_t drain;
			recv(fd, &drain, 1, 0); /* hold the connection until the server is done */
		} else {
			uint8_t ack = 1;
			if (full_io(fd, &ack, 1, 0) == 0 && ack == 0) st = FW_COMPLETED;
		}
	}
	close(fd);
	finish(b, i, st);
	unref(b);
	return NULL;
}

int fw_batch_add(struct fw_batch *b, const char *peer, uintptr_t src, uint64_t dst, uint64_t len) {
	if (b->n == b->cap || strlen(peer) >= 128 || !strchr(peer, ':')) return -1;
	struct task *t = &b->tasks[b->n++];
	t->src = src;
	t->dst = dst;
	t->len = len;
	snprintf(t->peer, sizeof t->peer, "%s", peer);
	return 0;
}

int fw_batch_add_unsent(struct fw_batch *b, int status) {
	if (b->n == b->cap) return -1;
	pthread_mutex_lock(&b->mu);
	struct task *t = &b->tasks[b->n++];
	t->status = status;
	b->started = b->n; /* fw_batch_start must not send it */
	pthread_mutex_unlock(&b->mu);
	return 0;
}

void fw_batch_start(struct fw_batch *b) {
	int64_t timeout = env_ll("KVFENCE_FAKE_STATUS_TIMEOUT_MS", 30000) * 1000000LL;
	uint64_t forever = (uint64_t)env_ll("KVFENCE_FAKE_WAIT_FOREVER_BYTES", 4 << 20);
	for (; b->started < b->n; b->started++) {
		struct task *t = &b->tasks[b->started];
		t->deadline_ns = (t->len >= forever || timeout == 0) ? 0 : now_ns() + timeout;
		struct job *j = malloc(sizeof *j);
		j->b = b;
		j->i = b->started;
		pthread_mutex_lock(&b->mu);
		b->refs++;
		pthread_mutex_unlock(&b->mu);
		pthread_t th;
		pthread_create(&th, NULL, send_one, j);
		pthread_detach(th);
	}
}

size_t fw_batch_len(struct fw_batch *b) { return b->n; }

int fw_task_status(struct fw_batch *b, size_t i, int *status, uint64_t *bytes) {
	pthread_mutex_lock(&b->mu);
	if (i >= b->n) {
		pthread_mutex_unlock(&b->mu);
		return -1;
	}
	struct task *t = &b->tasks[i];
	if (t->status == FW_WAITING && t->deadline_ns && now_ns() > t->deadline_ns) t->status = FW_FAILED;
	*status = t->status;
	*bytes = t->status == FW_COMPLETED ? t->len : 0; /* not a lower bound, as measured */
	if (t->status != FW_WAITING) t->polled_terminal = 1;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

int fw_batch_free(struct fw_batch *b, int force) {
	pthread_mutex_lock(&b->mu);
	for (size_t i = 0; i < b->n && !force; i++)
		if (!b->tasks[i].polled_terminal) {
			pthread_mutex_unlock(&b->mu);
			return 4;
		}
	pthread_mutex_unlock(&b->mu);
	unref(b);
	return 0;
}
