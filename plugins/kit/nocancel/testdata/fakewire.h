/*
 * The data path shared by this project's fake vendor libraries (tests
 * only). Each process runs one engine: a loopback TCP listener whose
 * server threads copy each incoming write straight into the address its
 * header names (registration checked once, at the start). A write is one
 * connection: header {size, address, flags}, payload, and with v2 framing
 * an acknowledgement after the target applied it.
 *
 * Fault behaviours of the real libraries, on by environment:
 *   KVFENCE_FAKE_STATUS_TIMEOUT_MS   an unacknowledged task reads FAILED after
 *                                    this (0: never; default 30000) while its
 *                                    sender goes on: the bytes land later
 *   KVFENCE_FAKE_WAIT_FOREVER_BYTES  tasks this large or larger never time out
 *                                    (default 4 MiB)
 *   MC_TCP_PROTO=1                   legacy framing: COMPLETED once sent
 */
#ifndef KVFENCE_FAKEWIRE_H
#define KVFENCE_FAKEWIRE_H
#include <stddef.h>
#include <stdint.h>

enum { FW_WAITING = 0, FW_COMPLETED = 4, FW_FAILED = 6 };

struct fw_engine;
struct fw_batch;

struct fw_engine *fw_start(const char *host);
int fw_name(struct fw_engine *e, char *buf, size_t n); /* "host:port" */
int fw_register(struct fw_engine *e, uintptr_t addr, size_t len);
int fw_unregister(struct fw_engine *e, uintptr_t addr);

struct fw_batch *fw_batch_new(size_t cap);
/* Queues a task; fw_batch_start sends every queued task. */
int fw_batch_add(struct fw_batch *b, const char *peer, uintptr_t src, uint64_t dst, uint64_t len);
void fw_batch_start(struct fw_batch *b);
/* Records a task that is never sent and reads status from the start (a
 * refused submit's unposted tasks: older Mooncake engines read them
 * COMPLETED, their slice count being 0). */
int fw_batch_add_unsent(struct fw_batch *b, int status);
size_t fw_batch_len(struct fw_batch *b);
/* Reads a task's status (FW_*); a terminal read is remembered. */
int fw_task_status(struct fw_batch *b, size_t i, int *status, uint64_t *bytes);
/* 0, or 4 (busy) while a task was not yet read terminal; force skips that. */
int fw_batch_free(struct fw_batch *b, int force);
#endif
