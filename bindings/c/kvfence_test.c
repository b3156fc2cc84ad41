/* The C ABI's test: a decode rank and a prefill rank (each with its own
 * transport plugin process) driven only through bin/kvfence.h, from several
 * threads at once. Every page's bytes are checked; one request per thread
 * is aborted mid-transfer and its slots must come back through a release
 * path other than "completed". Bad input must come back as classified
 * errors. Exit status 0 means every check passed. */
#define _DEFAULT_SOURCE /* usleep */
#include "kvfence.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHARD 4096
#define THREADS 4
#define ROUNDS 6
#define PAGES 3

static kvfence_handle dec, pre;
static int failures;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

#define CHECK(cond, ...)                                         \
	do {                                                         \
		if (!(cond)) {                                           \
			pthread_mutex_lock(&mu);                             \
			failures++;                                          \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                        \
			fprintf(stderr, "\n");                               \
			pthread_mutex_unlock(&mu);                           \
		}                                                        \
	} while (0)

/* fill writes a pattern unique to (room, page) so that a byte landing in
 * another request's page shows. */
static void fill(unsigned char *p, uint64_t room, int page) {
	for (int i = 0; i < SHARD; i++)
		p[i] = (unsigned char)(room * 131 + page * 17 + i * 7);
}

static int same(const unsigned char *p, uint64_t room, int page) {
	unsigned char want[SHARD];
	fill(want, room, page);
	return memcmp(p, want, SHARD) == 0;
}

static void *worker(void *arg) {
	int id = (int)(intptr_t)arg;
	uint32_t ranks[1] = {1};
	unsigned char buf[PAGES * SHARD];
	kvfence_error e;
	for (int round = 0; round < ROUNDS; round++) {
		uint64_t room = (uint64_t)(id * 1000 + round + 1);
		int abort_it = round == ROUNDS - 1;
		kvfence_handle rv, sd;
		CHECK(kvfence_receiver_new(dec, room, 1, &rv, &e) == 0, "receiver_new: %s", e.message);
		int rc;
		while ((rc = kvfence_receiver_init(rv, PAGES, ranks, 1, &e)) == KVFENCE_E_RESOURCE_EXHAUSTED)
			usleep(10000); /* the pool is full (holds count): retry */
		CHECK(rc == 0, "receiver_init: %s", e.message);
		CHECK(kvfence_sender_new(pre, room, 1, &sd, &e) == 0, "sender_new: %s", e.message);
		while ((rc = kvfence_sender_init(sd, PAGES, &e)) == KVFENCE_E_RESOURCE_EXHAUSTED)
			usleep(10000);
		CHECK(rc == 0, "sender_init: %s", e.message);
		for (int p = 0; p < PAGES; p++)
			fill(buf + p * SHARD, room, p);
		CHECK(kvfence_sender_write(sd, 0, PAGES, buf, sizeof buf, &e) == 0, "sender_write: %s", e.message);
		if (abort_it) {
			/* Send one page, then abort on decode while it may be in flight. */
			CHECK(kvfence_sender_send(sd, 1, &e) == 0, "send: %s", e.message);
			CHECK(kvfence_receiver_abort(rv, &e) == 0, "receiver_abort: %s", e.message);
			CHECK(kvfence_wait(rv, 10000) == KVFENCE_POLL_FAILED, "aborted receiver not Failed");
			CHECK(kvfence_failure(rv, &e) == KVFENCE_E_UNAVAILABLE, "failure code %d", e.code);
			CHECK(kvfence_receiver_read(rv, 0, 1, buf, sizeof buf, &e) == KVFENCE_E_FAILED_PRECONDITION,
			      "read of an aborted request: %d", e.code);
			/* The slots come back only when the runtime proves no write lands. */
			for (int i = 0; i < 1000 && kvfence_receiver_released(rv) == 0; i++)
				usleep(10000);
			CHECK(kvfence_receiver_released(rv) == 1, "aborted request's slots never released");
			kvfence_sender_abort(sd, &e);
		} else {
			CHECK(kvfence_sender_send(sd, PAGES, &e) == 0, "send: %s", e.message);
			CHECK(kvfence_sender_finish(sd, PAGES, &e) == 0, "finish: %s", e.message);
			int st = kvfence_wait(rv, 10000);
			CHECK(st == KVFENCE_POLL_SUCCESS, "room %llu: state %d", (unsigned long long)room, st);
			memset(buf, 0, sizeof buf);
			CHECK(kvfence_receiver_read(rv, 0, PAGES, buf, sizeof buf, &e) == 0, "read: %s", e.message);
			for (int p = 0; p < PAGES; p++)
				CHECK(same(buf + p * SHARD, room, p), "room %llu page %d: wrong bytes", (unsigned long long)room, p);
			CHECK(kvfence_receiver_finish(rv, &e) == 0, "finish: %s", e.message);
			CHECK(kvfence_wait(sd, 10000) == KVFENCE_POLL_SUCCESS, "sender not Success");
		}
		CHECK(kvfence_close(sd, &e) == 0, "close sender: %s", e.message);
		CHECK(kvfence_close(rv, &e) == 0, "close receiver: %s", e.message);
	}
	return NULL;
}

static void bad_input(void) {
	kvfence_error e;
	kvfence_handle h = 0;
	CHECK(kvfence_decode_open("{\"slots\": 4, \"shard_bytes\": 64, \"fense\": true}", &h, &e) == KVFENCE_E_INVALID_ARGUMENT,
	      "misspelt field: code %d", e.code);
	CHECK(strstr(e.message, "fense") != NULL, "message does not name the field: %s", e.message);
	CHECK(kvfence_decode_open("not json", &h, &e) == KVFENCE_E_INVALID_ARGUMENT, "not json: %d", e.code);
	CHECK(kvfence_poll(987654321) == -KVFENCE_E_NOT_FOUND, "poll of a bad handle");
	CHECK(kvfence_close(987654321, &e) == KVFENCE_E_NOT_FOUND, "close of a bad handle: %d", e.code);
	CHECK(kvfence_sender_new(dec, 1, 1, &h, &e) == KVFENCE_E_INVALID_ARGUMENT, "sender on decode: %d", e.code);
	CHECK(kvfence_poll(dec) == -KVFENCE_E_INVALID_ARGUMENT, "poll of an agent handle");
	kvfence_handle rv;
	CHECK(kvfence_receiver_new(dec, 77, 1, &rv, &e) == 0, "receiver_new");
	CHECK(kvfence_receiver_init(rv, 0, (uint32_t[]){1}, 1, &e) == KVFENCE_E_INVALID_ARGUMENT, "zero pages: %d (%s)", e.code, e.message);
	kvfence_close(rv, &e);
	char tiny[4];
	size_t need = 0;
	CHECK(kvfence_agent_metrics(dec, tiny, sizeof tiny, &need, &e) == KVFENCE_E_RESOURCE_EXHAUSTED && need > 4,
	      "small metrics buffer: %d", e.code);
}

/* hostile: arguments that crashed or hung the engine before the ABI
 * checked them. Each must come back as a classified refusal, at once. */
static void *close_later(void *arg) {
	usleep(50000); /* let the waiter block (it returns either way) */
	kvfence_error e;
	kvfence_close(*(kvfence_handle *)arg, &e);
	return NULL;
}

static void hostile(void) {
	kvfence_error e;
	kvfence_handle rv;
	CHECK(kvfence_receiver_new(dec, 88, 1, &rv, &e) == 0, "receiver_new: %s", e.message);
	uint32_t one[1] = {1};
	CHECK(kvfence_receiver_init(rv, 1, one, INT32_MAX, &e) == KVFENCE_E_INVALID_ARGUMENT,
	      "nranks = INT_MAX: %d (%s)", e.code, e.message);
	CHECK(kvfence_receiver_init(rv, INT32_MAX, one, 1, &e) == KVFENCE_E_INVALID_ARGUMENT, "pages = INT_MAX: %d", e.code);
	CHECK(kvfence_wait(rv, -1) == -KVFENCE_E_INVALID_ARGUMENT, "negative timeout");
	CHECK(kvfence_poll_go_ns(rv, INT64_MAX) == -(double)KVFENCE_E_INVALID_ARGUMENT, "poll_go_ns(INT64_MAX)");
	CHECK(kvfence_page_bytes_go_ns(dec, INT64_MAX) == -(double)KVFENCE_E_INVALID_ARGUMENT, "page_bytes_go_ns(INT64_MAX)");
	/* A wait with the largest timeout, woken by a close from another thread. */
	pthread_t th;
	pthread_create(&th, NULL, close_later, &rv);
	int st = kvfence_wait(rv, INT64_MAX);
	pthread_join(th, NULL);
	CHECK(st == -KVFENCE_E_NOT_FOUND, "wait on a handle closed by another thread: %d", st);
	CHECK(kvfence_decode_open("{\"slots\": 2147483647, \"shard_bytes\": 9223372036854775807}", &rv, &e) ==
	          KVFENCE_E_INVALID_ARGUMENT, "huge pool: %d", e.code);
}

static int count_path(const char *stats, const char *path) {
	/* stats JSON: "released":{"completed":N,"drained":M,...} */
	const char *r = strstr(stats, "\"released\":{");
	if (!r) return 0;
	char key[64];
	snprintf(key, sizeof key, "\"%s\":", path);
	const char *k = strstr(r, key);
	const char *end = strchr(r, '}');
	if (!k || k > end) return 0;
	return atoi(k + strlen(key));
}

/* boundary_cost prints what a poll costs from C against the same poll
 * made from Go in the same run (a figure, not a check: the machine is shared). */
static void boundary_cost(void) {
	kvfence_error e;
	kvfence_handle rv;
	const int64_t n = 200000;
	if (kvfence_receiver_new(dec, 999999, 1, &rv, &e) != 0)
		return;
	double go_ns = kvfence_poll_go_ns(rv, n);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int64_t i = 0; i < n; i++)
		kvfence_poll(rv);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double c_ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
	printf("boundary: poll from Go %.0f ns, from C %.0f ns per call (C/Go %.2fx)\n", go_ns, c_ns, c_ns / go_ns);
	/* A call without the event loop: the crossing itself. */
	double go_pb = kvfence_page_bytes_go_ns(dec, n);
	int64_t sink = 0;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int64_t i = 0; i < n; i++)
		sink += kvfence_page_bytes(dec);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double c_pb = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
	printf("boundary: page_bytes from Go %.0f ns, from C %.0f ns per call (C/Go %.1fx)%s\n", go_pb, c_pb, c_pb / go_pb,
	       sink > 0 ? "" : " ?");
	kvfence_close(rv, &e);
}

int main(void) {
	const char *plugin = getenv("KVFENCE_PLUGIN");
	if (!plugin) {
		fprintf(stderr, "set KVFENCE_PLUGIN to the transport plugin binary\n");
		return 2;
	}
	printf("%s\n", kvfence_version());
	kvfence_error e;
	if (kvfence_decode_open("{\"rank\": 0, \"slots\": 16, \"shard_bytes\": 4096, \"shards\": 1, \"lease_ms\": 2000,"
	                        " \"max_hold_ms\": 10000, \"control_addr\": \"127.0.0.1:0\"}", &dec, &e) != 0) {
		fprintf(stderr, "decode_open: %s\n", e.message);
		return 1;
	}
	char addr[128], cfg[512];
	CHECK(kvfence_agent_addr(dec, addr, sizeof addr, &e) == 0, "addr: %s", e.message);
	CHECK(kvfence_page_bytes(dec) == SHARD, "decode page bytes");
	snprintf(cfg, sizeof cfg, "{\"rank\": 1, \"decode_addr\": \"%s\", \"source_pages\": 16, \"shard_bytes\": 4096,"
	         " \"heartbeat_ms\": 100, \"request_tombstone_ms\": 5000, \"bootstrap_timeout_ms\": 5000}", addr);
	if (kvfence_prefill_open(cfg, &pre, &e) != 0) {
		fprintf(stderr, "prefill_open: %s\n", e.message);
		return 1;
	}
	for (int i = 0; i < 500 && kvfence_prefill_linked(pre) != 1; i++)
		usleep(10000);
	CHECK(kvfence_prefill_linked(pre) == 1, "prefill never linked");
	for (int i = 0; i < 500 && kvfence_decode_linked(dec, 1) != 1; i++)
		usleep(10000);
	CHECK(kvfence_decode_linked(dec, 1) == 1, "decode never saw rank 1 link");
	CHECK(kvfence_decode_linked(pre, 1) == -KVFENCE_E_INVALID_ARGUMENT, "decode_linked on a prefill handle");
	bad_input();
	hostile();

	pthread_t th[THREADS];
	for (int i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);

	static char stats[1 << 16], metrics[1 << 18];
	CHECK(kvfence_agent_stats(dec, stats, sizeof stats, NULL, &e) == 0, "stats: %s", e.message);
	CHECK(kvfence_agent_metrics(dec, metrics, sizeof metrics, NULL, &e) == 0, "metrics: %s", e.message);
	int completed = count_path(stats, "completed");
	int aborted = count_path(stats, "drained") + count_path(stats, "fenced") + count_path(stats, "timeout");
	CHECK(strstr(stats, "\"corrupt_pages\":0,") != NULL, "corrupt pages: %s", stats);
	CHECK(completed == THREADS * (ROUNDS - 1), "completed %d, want %d", completed, THREADS * (ROUNDS - 1));
	CHECK(aborted == THREADS, "aborted requests released %d times, want %d: %s", aborted, THREADS, stats);
	CHECK(strstr(metrics, "kvfence_releases_total") != NULL, "no kvfence_releases_total in metrics");
	printf("requests %d, completed %d, aborted and released safely %d\n", THREADS * ROUNDS, completed, aborted);

	boundary_cost();
	CHECK(kvfence_close(pre, &e) == 0, "close prefill: %s", e.message);
	CHECK(kvfence_close(dec, &e) == 0, "close decode: %s", e.message);
	CHECK(kvfence_close(dec, &e) == KVFENCE_E_NOT_FOUND, "double close: %d", e.code);
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("PASS\n");
	return 0;
}
