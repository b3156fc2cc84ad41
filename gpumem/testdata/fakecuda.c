/* A fake CUDA driver for kvfence's gpumem tests. Written for this project
 * from the public driver API's documented behaviour; it copies no NVIDIA
 * header. It is built by the test into a temporary directory (never
 * committed as a binary) and loaded through KVFENCE_CUDA_LIB.
 *
 * What it imitates, and how strictly:
 *   - device memory is one memfd mapped PROT_NONE at the addresses it hands
 *     out, so host code that touches a device pointer faults, as on a GPU;
 *     the fake's own copies go through a second, private read-write view;
 *   - each stream has a worker thread that runs its copies late (after
 *     FAKECUDA_DELAY_US microseconds each, read when the stream is made),
 *     in order;
 *   - an event completes only when its stream's worker reaches it;
 *   - asynchronous copies refuse host memory that is not registered
 *     (cuMemHostRegister), as a strict driver may;
 *   - cuMemGetHandleForAddressRange hands out a dup of the memfd (dma-buf).
 * Counters (fakecuda_async_copies, ...) let tests count copies. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { OK = 0, E_INVALID_VALUE = 1, E_NOT_INITIALIZED = 3, E_NO_DEVICE = 100,
       E_INVALID_HANDLE = 400, E_NOT_READY = 600, E_HOST_REGISTERED = 712 };

#define DEV_BYTES (1ull << 31) /* sparse: pages exist only once touched */
static int memfd = -1;
static char *dev_base, *dev_view;
static size_t dev_next = 1 << 16;
static int inited;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static unsigned long n_async, n_sync, n_refused;

struct region { char *p; size_t n; };
static struct region pinned[64];

struct event { unsigned long want, stream_id; int recorded, fail; struct stream *s; };
enum { OP_COPY, OP_EVENT };
struct op { int kind; char *dst, *src; size_t n; struct event *ev; unsigned long seq; struct op *next; };
struct stream { pthread_t th; struct op *head, *tail; unsigned long queued, reached, delay; int stop; };

static unsigned long delay_us(void) {
  const char *v = getenv("FAKECUDA_DELAY_US");
  return v ? strtoul(v, 0, 10) : 200;
}

CUresult cuInit(unsigned flags) {
  (void)flags;
  if (getenv("FAKECUDA_NO_DEVICE")) return E_NO_DEVICE;
  pthread_mutex_lock(&mu);
  if (!inited) {
    memfd = memfd_create("fakecuda-device", MFD_CLOEXEC);
    if (memfd < 0 || ftruncate(memfd, DEV_BYTES) != 0) { pthread_mutex_unlock(&mu); return E_NO_DEVICE; }
    dev_base = mmap(0, DEV_BYTES, PROT_NONE, MAP_SHARED, memfd, 0);
    dev_view = mmap(0, DEV_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (dev_base == MAP_FAILED || dev_view == MAP_FAILED) { pthread_mutex_unlock(&mu); return E_NO_DEVICE; }
    inited = 1;
  }
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuDeviceGetCount(int *n) { if (!inited) return E_NOT_INITIALIZED; *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { if (!inited) return E_NOT_INITIALIZED; if (ordinal != 0) return E_INVALID_VALUE; *d = 0; return OK; }
/* A real address: Go holds the context as unsafe.Pointer, and a value
 * like 0x1 on a goroutine stack is fatal when the stack moves ("invalid
 * pointer found on stack"), as a real driver's context never is. */
static char primary_ctx;
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; if (!inited) return E_NOT_INITIALIZED; *ctx = &primary_ctx; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &primary_ctx ? OK : E_INVALID_HANDLE; }

CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
  case OK: *s = "CUDA_SUCCESS"; return OK;
  case E_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
  case E_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
  case E_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return OK;
  case E_HOST_REGISTERED: *s = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; return OK;
  case 719: *s = "CUDA_ERROR_LAUNCH_FAILED"; return OK;
  default: *s = "CUDA_ERROR_UNKNOWN"; return OK;
  }
}

static int in_device(CUdeviceptr p, size_t n) {
  char *c = (char *)(uintptr_t)p;
  return inited && c >= dev_base && n <= DEV_BYTES && c + n <= dev_base + dev_next;
}
static char *view(CUdeviceptr p) { return dev_view + ((char *)(uintptr_t)p - dev_base); }

static int is_pinned(const void *p, size_t n) {
  const char *c = p;
  for (int i = 0; i < 64; i++)
    if (pinned[i].p && c >= pinned[i].p && c + n <= pinned[i].p + pinned[i].n) return 1;
  return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (!inited) return E_NOT_INITIALIZED;
  pthread_mutex_lock(&mu);
  size_t at = dev_next, sz = (n + 4095) & ~(size_t)4095;
  if (at + sz > DEV_BYTES) { pthread_mutex_unlock(&mu); return 2; /* OUT_OF_MEMORY */ }
  dev_next += sz;
  pthread_mutex_unlock(&mu);
  *p = (CUdeviceptr)(uintptr_t)(dev_base + at);
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return in_device(p, 1) ? OK : E_INVALID_VALUE; }

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
  (void)flags;
  pthread_mutex_lock(&mu);
  if (is_pinned(p, 1)) { pthread_mutex_unlock(&mu); return E_HOST_REGISTERED; }
  for (int i = 0; i < 64; i++)
    if (!pinned[i].p) { pinned[i].p = p; pinned[i].n = n; pthread_mutex_unlock(&mu); return OK; }
  pthread_mutex_unlock(&mu);
  return E_INVALID_VALUE;
}
CUresult cuMemHostUnregister(void *p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < 64; i++)
    if (pinned[i].p == p) { pinned[i].p = 0; pthread_mutex_unlock(&mu); return OK; }
  pthread_mutex_unlock(&mu);
  return E_INVALID_VALUE;
}

/* CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2; CU_MEMORYTYPE_HOST = 1, DEVICE = 2. */
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  if (attr != 2) return E_INVALID_VALUE;
  if (in_device(p, 1)) { *(unsigned *)data = 2; return OK; }
  pthread_mutex_lock(&mu);
  int pin = is_pinned((void *)(uintptr_t)p, 1);
  pthread_mutex_unlock(&mu);
  if (pin) { *(unsigned *)data = 1; return OK; }
  return E_INVALID_VALUE;
}

static void *worker(void *arg) {
  struct stream *s = arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&cv, &mu);
    if (!s->head) break;
    struct op *o = s->head;
    pthread_mutex_unlock(&mu);
    if (o->kind == OP_COPY) { usleep(s->delay); memcpy(o->dst, o->src, o->n); }
    pthread_mutex_lock(&mu);
    s->head = o->next;
    if (!s->head) s->tail = 0;
    s->reached = o->seq;
    free(o);
    pthread_cond_broadcast(&cv);
  }
  pthread_mutex_unlock(&mu);
  return 0;
}

CUresult cuStreamCreate(void **out, unsigned flags) {
  (void)flags;
  if (!inited) return E_NOT_INITIALIZED;
  struct stream *s = calloc(1, sizeof *s);
  s->delay = delay_us(); /* read here, not on the worker: getenv races setenv */
  if (pthread_create(&s->th, 0, worker, s) != 0) { free(s); return E_INVALID_VALUE; }
  *out = s;
  return OK;
}

static void push(struct stream *s, struct op *o) { /* mu held */
  o->seq = ++s->queued;
  if (s->tail) s->tail->next = o; else s->head = o;
  s->tail = o;
  pthread_cond_broadcast(&cv);
}

CUresult cuStreamSynchronize(void *sp) {
  struct stream *s = sp;
  pthread_mutex_lock(&mu);
  unsigned long want = s->queued;
  while (s->reached < want) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuStreamDestroy_v2(void *sp) {
  struct stream *s = sp;
  cuStreamSynchronize(s);
  pthread_mutex_lock(&mu);
  s->stop = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  pthread_join(s->th, 0);
  free(s);
  return OK;
}

static CUresult async_copy(char *dst, char *src, size_t n, struct stream *s) {
  struct op *o = calloc(1, sizeof *o);
  o->kind = OP_COPY; o->dst = dst; o->src = src; o->n = n;
  pthread_mutex_lock(&mu);
  n_async++;
  push(s, o);
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
  pthread_mutex_lock(&mu);
  int pin = is_pinned(dst, n);
  if (!pin) n_refused++;
  pthread_mutex_unlock(&mu);
  if (!in_device(src, n) || !pin || !s) return E_INVALID_VALUE;
  return async_copy(dst, view(src), n, s);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
  pthread_mutex_lock(&mu);
  int pin = is_pinned(src, n);
  if (!pin) n_refused++;
  pthread_mutex_unlock(&mu);
  if (!in_device(dst, n) || !pin || !s) return E_INVALID_VALUE;
  return async_copy(view(dst), (char *)src, n, s);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  if (!in_device(src, n)) return E_INVALID_VALUE;
  memcpy(dst, view(src), n);
  pthread_mutex_lock(&mu); n_sync++; pthread_mutex_unlock(&mu);
  return OK;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  if (!in_device(dst, n)) return E_INVALID_VALUE;
  memcpy(view(dst), src, n);
  pthread_mutex_lock(&mu); n_sync++; pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuEventCreate(void **out, unsigned flags) {
  (void)flags;
  struct event *e = calloc(1, sizeof *e);
  e->fail = getenv("FAKECUDA_EVENT_FAIL") != 0; /* its wait reports a device fault */
  *out = e;
  return OK;
}
CUresult cuEventDestroy_v2(void *e) { free(e); return OK; }

CUresult cuEventRecord(void *ep, void *sp) {
  struct event *e = ep;
  struct stream *s = sp;
  struct op *o = calloc(1, sizeof *o);
  o->kind = OP_EVENT;
  pthread_mutex_lock(&mu);
  push(s, o);
  e->s = s; e->want = o->seq; e->recorded = 1;
  pthread_mutex_unlock(&mu);
  return OK;
}

CUresult cuEventQuery(void *ep) {
  struct event *e = ep;
  pthread_mutex_lock(&mu);
  int done = !e->recorded || e->s->reached >= e->want;
  pthread_mutex_unlock(&mu);
  return done ? OK : E_NOT_READY;
}

CUresult cuEventSynchronize(void *ep) {
  struct event *e = ep;
  pthread_mutex_lock(&mu);
  while (e->recorded && e->s->reached < e->want) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return e->fail ? 719 /* CUDA_ERROR_LAUNCH_FAILED */ : OK;
}

/* dma-buf export (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1): the memfd.
 * -DFAKECUDA_NO_DMABUF builds a driver without it (older than CUDA 11.7). */
#ifndef FAKECUDA_NO_DMABUF
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t n, int type, unsigned long long flags) {
  (void)flags;
  if (type != 1 || !in_device(p, n)) return E_INVALID_VALUE;
  *(int *)handle = dup(memfd);
  return OK;
}

/* Where device address p lies in the dma-buf above (a real driver's buffer
 * starts at the exported address; the fake's is the whole device memfd).
 * Not part of any driver. */
unsigned long fakecuda_dmabuf_offset(CUdeviceptr p) { return (unsigned long)(p - (CUdeviceptr)dev_base); }
#endif

/* The one fake device's PCI bus id. */
CUresult cuDeviceGetPCIBusId(char *buf, int n, int dev) {
  if (dev != 0 || n < 13) return E_INVALID_VALUE;
  snprintf(buf, (size_t)n, "0000:18:00.0");
  return OK;
}

/* Test counters: not part of any driver. */
unsigned long fakecuda_async_copies(void) { pthread_mutex_lock(&mu); unsigned long v = n_async; pthread_mutex_unlock(&mu); return v; }
unsigned long fakecuda_sync_copies(void) { pthread_mutex_lock(&mu); unsigned long v = n_sync; pthread_mutex_unlock(&mu); return v; }
unsigned long fakecuda_refused_copies(void) { pthread_mutex_lock(&mu); unsigned long v = n_refused; pthread_mutex_unlock(&mu); return v; }
