package gpumem

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The CUDA driver API as kvfence uses it, declared here from the public
// driver API reference (types reduced to what the calls need; no NVIDIA
// header is used). Symbol names are the ABI's versioned ones.
typedef int kvf_CUresult;
typedef unsigned long long kvf_devptr;

struct kvf_cuda {
	void *lib;
	kvf_CUresult (*init)(unsigned);
	kvf_CUresult (*deviceGetCount)(int *);
	kvf_CUresult (*deviceGet)(int *, int);
	kvf_CUresult (*primaryCtxRetain)(void **, int);
	kvf_CUresult (*ctxSetCurrent)(void *);
	kvf_CUresult (*getErrorName)(kvf_CUresult, const char **);
	kvf_CUresult (*pointerGetAttribute)(void *, int, kvf_devptr);
	kvf_CUresult (*memAlloc)(kvf_devptr *, size_t);
	kvf_CUresult (*memFree)(kvf_devptr);
	kvf_CUresult (*hostRegister)(void *, size_t, unsigned);
	kvf_CUresult (*hostUnregister)(void *);
	kvf_CUresult (*dtoh)(void *, kvf_devptr, size_t);
	kvf_CUresult (*htod)(kvf_devptr, const void *, size_t);
	kvf_CUresult (*dtohAsync)(void *, kvf_devptr, size_t, void *);
	kvf_CUresult (*htodAsync)(kvf_devptr, const void *, size_t, void *);
	kvf_CUresult (*streamCreate)(void **, unsigned);
	kvf_CUresult (*streamSynchronize)(void *);
	kvf_CUresult (*streamDestroy)(void *);
	kvf_CUresult (*eventCreate)(void **, unsigned);
	kvf_CUresult (*eventRecord)(void *, void *);
	kvf_CUresult (*eventQuery)(void *);
	kvf_CUresult (*eventSynchronize)(void *);
	kvf_CUresult (*eventDestroy)(void *);
};

static const char *kvf_names[] = {
	"cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
	"cuCtxSetCurrent", "cuGetErrorName", "cuPointerGetAttribute",
	"cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostRegister_v2", "cuMemHostUnregister",
	"cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyHtoDAsync_v2",
	"cuStreamCreate", "cuStreamSynchronize", "cuStreamDestroy_v2",
	"cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuEventDestroy_v2",
};

// kvf_load fills c from the library at path. It returns 0, or 1 when the
// library does not open (err holds dlerror), or 2+i when symbol i is missing.
static int kvf_load(struct kvf_cuda *c, const char *path, char *err, size_t errn) {
	memset(c, 0, sizeof *c);
	c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!c->lib) {
		const char *e = dlerror();
		strncpy(err, e ? e : "dlopen failed", errn - 1);
		err[errn - 1] = 0;
		return 1;
	}
	void **slots = (void **)&c->init;
	for (size_t i = 0; i < sizeof kvf_names / sizeof kvf_names[0]; i++) {
		slots[i] = dlsym(c->lib, kvf_names[i]);
		if (!slots[i]) { dlclose(c->lib); c->lib = 0; return 2 + (int)i; }
	}
	return 0;
}
static const char *kvf_name(int i) { return kvf_names[i]; }

// kvf_counter calls an optional no-argument counter a test driver exports
// (the fake's fakecuda_async_copies, ...); -1 when there is none.
static long kvf_counter(struct kvf_cuda *c, const char *name) {
	unsigned long (*f)(void) = (unsigned long (*)(void))dlsym(c->lib, name);
	return f ? (long)f() : -1;
}

// kvf_export_dmabuf exports [p, p+n) as a dma-buf fd with the optional
// cuMemGetHandleForAddressRange (CUDA 11.7+; CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
// = 1, flags 0). -1 when the driver lacks it. *off is where p lies in the
// buffer: 0 for a real driver; a test driver may say otherwise through
// fakecuda_dmabuf_offset (the fake's dma-buf is its whole device memfd).
static kvf_CUresult kvf_export_dmabuf(struct kvf_cuda *c, void *ctx, uintptr_t p, size_t n, int *fd, uint64_t *off) {
	kvf_CUresult (*exp)(void *, kvf_devptr, size_t, int, unsigned long long) =
		(kvf_CUresult (*)(void *, kvf_devptr, size_t, int, unsigned long long))dlsym(c->lib, "cuMemGetHandleForAddressRange");
	if (!exp) return -1;
	kvf_CUresult r = c->ctxSetCurrent(ctx);
	if (r) return r;
	if ((r = exp(fd, p, n, 1, 0))) return r;
	unsigned long (*fo)(uintptr_t) = (unsigned long (*)(uintptr_t))dlsym(c->lib, "fakecuda_dmabuf_offset");
	*off = fo ? fo(p) : 0;
	return 0;
}

// kvf_pci_bus_id writes device ordinal's PCI bus id ("0000:18:00.0") into
// buf with the optional cuDeviceGetPCIBusId; -1 when the driver lacks it.
static kvf_CUresult kvf_pci_bus_id(struct kvf_cuda *c, int ordinal, char *buf, int n) {
	kvf_CUresult (*f)(char *, int, int) = (kvf_CUresult (*)(char *, int, int))dlsym(c->lib, "cuDeviceGetPCIBusId");
	if (!f) return -1;
	int dev = 0;
	kvf_CUresult r = c->deviceGet(&dev, ordinal);
	return r ? r : f(buf, n, dev);
}

// Every call on a context first makes it current on this OS thread: Go
// moves goroutines between threads, and CUDA's current context is per thread.
#define CTX(c, ctx) do { kvf_CUresult r_ = (c)->ctxSetCurrent(ctx); if (r_) return r_; } while (0)

static kvf_CUresult kvf_open(struct kvf_cuda *c, int ordinal, void **ctx) {
	kvf_CUresult r = c->init(0);
	if (r) return r;
	int n = 0, dev = 0;
	if ((r = c->deviceGetCount(&n))) return r;
	if (ordinal >= n) return 101; // CUDA_ERROR_INVALID_DEVICE
	if ((r = c->deviceGet(&dev, ordinal))) return r;
	return c->primaryCtxRetain(ctx, dev);
}
static const char *kvf_errname(struct kvf_cuda *c, kvf_CUresult r) {
	const char *s = 0;
	if (c->getErrorName(r, &s) || !s) return "CUDA_ERROR_UNKNOWN";
	return s;
}
// CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2; the answer CU_MEMORYTYPE_DEVICE = 2.
static int kvf_is_device(struct kvf_cuda *c, void *ctx, uintptr_t p) {
	unsigned t = 0;
	if (c->ctxSetCurrent(ctx)) return 0;
	if (c->pointerGetAttribute(&t, 2, (kvf_devptr)p)) return 0;
	return t == 2;
}
static kvf_CUresult kvf_alloc(struct kvf_cuda *c, void *ctx, size_t n, uintptr_t *p) {
	CTX(c, ctx); kvf_devptr d = 0; kvf_CUresult r = c->memAlloc(&d, n); *p = (uintptr_t)d; return r;
}
static kvf_CUresult kvf_free(struct kvf_cuda *c, void *ctx, uintptr_t p) { CTX(c, ctx); return c->memFree(p); }
// CU_MEMHOSTREGISTER_PORTABLE = 1.
static kvf_CUresult kvf_register(struct kvf_cuda *c, void *ctx, void *p, size_t n) { CTX(c, ctx); return c->hostRegister(p, n, 1); }
static kvf_CUresult kvf_unregister(struct kvf_cuda *c, void *ctx, void *p) { CTX(c, ctx); return c->hostUnregister(p); }
static kvf_CUresult kvf_dtoh(struct kvf_cuda *c, void *ctx, void *dst, uintptr_t src, size_t n) { CTX(c, ctx); return c->dtoh(dst, src, n); }
static kvf_CUresult kvf_htod(struct kvf_cuda *c, void *ctx, uintptr_t dst, const void *src, size_t n) { CTX(c, ctx); return c->htod(dst, src, n); }
// CU_STREAM_NON_BLOCKING = 1: never serialised behind the engine's legacy default stream.
static kvf_CUresult kvf_stream(struct kvf_cuda *c, void *ctx, void **s) { CTX(c, ctx); return c->streamCreate(s, 1); }
static kvf_CUresult kvf_stream_sync(struct kvf_cuda *c, void *ctx, void *s) { CTX(c, ctx); return c->streamSynchronize(s); }
static kvf_CUresult kvf_stream_destroy(struct kvf_cuda *c, void *ctx, void *s) { CTX(c, ctx); return c->streamDestroy(s); }
// CU_EVENT_DISABLE_TIMING = 2.
static kvf_CUresult kvf_event(struct kvf_cuda *c, void *ctx, void **e) { CTX(c, ctx); return c->eventCreate(e, 2); }
static kvf_CUresult kvf_event_destroy(struct kvf_cuda *c, void *ctx, void *e) { CTX(c, ctx); return c->eventDestroy(e); }
static kvf_CUresult kvf_event_sync(struct kvf_cuda *c, void *ctx, void *e) { CTX(c, ctx); return c->eventSynchronize(e); }

// kvf_copies enqueues n asynchronous copies then records ev on stream s;
// toDevice picks the direction. It returns the first failure and how many
// copies were enqueued before it (those will still run).
static kvf_CUresult kvf_copies(struct kvf_cuda *c, void *ctx, void *s, void *ev, int toDevice,
		const uintptr_t *dev, uintptr_t *host, const size_t *len, int n, int *enqueued) {
	CTX(c, ctx);
	*enqueued = 0;
	for (int i = 0; i < n; i++) {
		kvf_CUresult r = toDevice ? c->htodAsync(dev[i], (const void *)host[i], len[i], s)
		                          : c->dtohAsync((void *)host[i], dev[i], len[i], s);
		if (r) { c->eventRecord(ev, s); return r; }
		(*enqueued)++;
	}
	return c->eventRecord(ev, s);
}
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

// DefaultLibrary is the driver library opened when $KVFENCE_CUDA_LIB is unset.
const DefaultLibrary = "libcuda.so.1"

// errNotReady is CUDA_ERROR_NOT_READY.
const errNotReady = 600

// driver is one loaded driver library and one device's primary context.
type driver struct {
	c   *C.struct_kvf_cuda // C memory: Go must not hold C pointers to Go memory
	ctx unsafe.Pointer
	lib string
}

var (
	loadMu  sync.Mutex
	loaded  = map[string]*C.struct_kvf_cuda{}
	libPath = func() string {
		if p := os.Getenv("KVFENCE_CUDA_LIB"); p != "" {
			return p
		}
		return DefaultLibrary
	}
)

// openDriver loads the library (once per path: a driver is never unloaded)
// and retains the primary context of device ordinal. Every failure is
// FailedPrecondition and names the library: there is no GPU to use here.
func openDriver(lib string, ordinal int) (*driver, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	c := loaded[lib]
	if c == nil {
		c = (*C.struct_kvf_cuda)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_kvf_cuda{}))))
		var errbuf [256]C.char
		cpath := C.CString(lib)
		rc := C.kvf_load(c, cpath, &errbuf[0], C.size_t(len(errbuf)))
		C.free(unsafe.Pointer(cpath))
		switch {
		case rc == 1:
			C.free(unsafe.Pointer(c))
			return nil, errdefs.Errorf(errdefs.FailedPrecondition, "no CUDA driver: %s does not load (%s)", lib, C.GoString(&errbuf[0]))
		case rc > 1:
			C.free(unsafe.Pointer(c))
			return nil, errdefs.Errorf(errdefs.FailedPrecondition, "CUDA driver %s lacks %s: too old, or not a CUDA driver", lib, C.GoString(C.kvf_name(rc-2)))
		}
		loaded[lib] = c
	}
	d := &driver{c: c, lib: lib}
	if r := C.kvf_open(c, C.int(ordinal), &d.ctx); r != 0 {
		return nil, errdefs.Errorf(errdefs.FailedPrecondition, "CUDA driver %s: no usable device %d: %s", lib, ordinal, d.name(r))
	}
	return d, nil
}

func (d *driver) name(r C.kvf_CUresult) string { return C.GoString(C.kvf_errname(d.c, r)) }

// check turns a CUresult into a classified error: a bad pointer or size is
// the caller's (InvalidArgument), anything else the device's (Internal).
func (d *driver) check(r C.kvf_CUresult, what string) error {
	if r == 0 {
		return nil
	}
	cls := errdefs.Internal
	if r == 1 { // CUDA_ERROR_INVALID_VALUE
		cls = errdefs.InvalidArgument
	}
	return errdefs.Errorf(cls, "%s: %s (%d)", what, d.name(r), int(r))
}

func (d *driver) isDevice(p uintptr) bool { return C.kvf_is_device(d.c, d.ctx, C.uintptr_t(p)) != 0 }

func (d *driver) counter(name string) int64 {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	return int64(C.kvf_counter(d.c, cn))
}

func (d *driver) alloc(n int64) (uintptr, error) {
	var p C.uintptr_t
	err := d.check(C.kvf_alloc(d.c, d.ctx, C.size_t(n), &p), fmt.Sprintf("cuMemAlloc(%d)", n))
	return uintptr(p), err
}

// exportDMABuf is [p, p+n) as a dma-buf fd (the caller closes it) and the
// offset of p within it. A driver without the call, or a device or
// allocation that cannot export (CUDA_ERROR_NOT_SUPPORTED, 801), is
// FailedPrecondition: direct mode is not possible here, staged mode is.
func (d *driver) exportDMABuf(p uintptr, n int64) (int, uint64, error) {
	var fd C.int
	var off C.uint64_t
	r := C.kvf_export_dmabuf(d.c, d.ctx, C.uintptr_t(p), C.size_t(n), &fd, &off)
	switch r {
	case 0:
		return int(fd), uint64(off), nil
	case -1:
		return -1, 0, errdefs.Errorf(errdefs.FailedPrecondition, "CUDA driver %s lacks cuMemGetHandleForAddressRange (CUDA 11.7+): no dma-buf export, use staged mode", d.lib)
	case 801:
		return -1, 0, errdefs.Errorf(errdefs.FailedPrecondition, "cuMemGetHandleForAddressRange(%#x, %d): %s: this GPU, driver or allocation cannot export a dma-buf (needs the open kernel module), use staged mode", p, n, d.name(r))
	}
	return -1, 0, d.check(r, fmt.Sprintf("cuMemGetHandleForAddressRange(%#x, %d)", p, n))
}

// pciBusID is the device's PCI bus id, or "" when the driver cannot say.
func (d *driver) pciBusID(ordinal int) string {
	var buf [64]C.char
	if C.kvf_pci_bus_id(d.c, C.int(ordinal), &buf[0], C.int(len(buf))) != 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

func (d *driver) free(p uintptr) error {
	return d.check(C.kvf_free(d.c, d.ctx, C.uintptr_t(p)), "cuMemFree")
}

// register pins host memory that Go does not manage (an mmap).
func (d *driver) register(b []byte) error {
	return d.check(C.kvf_register(d.c, d.ctx, unsafe.Pointer(&b[0]), C.size_t(len(b))), "cuMemHostRegister")
}

func (d *driver) unregister(b []byte) error {
	return d.check(C.kvf_unregister(d.c, d.ctx, unsafe.Pointer(&b[0])), "cuMemHostUnregister")
}

// copyDtoH and copyHtoD are cuMemcpy: synchronous, any host memory.
func (d *driver) copyDtoH(dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.check(C.kvf_dtoh(d.c, d.ctx, unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst))), "cuMemcpyDtoH")
}

func (d *driver) copyHtoD(dst uintptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.check(C.kvf_htod(d.c, d.ctx, C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))), "cuMemcpyHtoD")
}

type stream struct{ p unsafe.Pointer }
type event struct{ p unsafe.Pointer }

func (d *driver) newStream() (stream, error) {
	var s stream
	return s, d.check(C.kvf_stream(d.c, d.ctx, &s.p), "cuStreamCreate")
}

func (d *driver) syncStream(s stream) error {
	return d.check(C.kvf_stream_sync(d.c, d.ctx, s.p), "cuStreamSynchronize")
}

func (d *driver) destroyStream(s stream) error {
	return d.check(C.kvf_stream_destroy(d.c, d.ctx, s.p), "cuStreamDestroy")
}

func (d *driver) newEvent() (event, error) {
	var e event
	return e, d.check(C.kvf_event(d.c, d.ctx, &e.p), "cuEventCreate")
}

func (d *driver) destroyEvent(e event) {
	_ = d.check(C.kvf_event_destroy(d.c, d.ctx, e.p), "cuEventDestroy")
}

func (d *driver) waitEvent(e event) error {
	return d.check(C.kvf_event_sync(d.c, d.ctx, e.p), "cuEventSynchronize")
}

// copyRun is one asynchronous copy: device range and pinned host address.
type copyRun struct {
	dev  uintptr
	host uintptr // inside pinned staging (an mmap, not Go memory)
	n    int64
}

// enqueue puts the runs on stream s, then records ev after them. It returns
// how many runs were enqueued (they will run even when err is not nil).
func (d *driver) enqueue(s stream, ev event, toDevice bool, runs []copyRun) (int, error) {
	n := len(runs)
	buf := C.malloc(C.size_t(n) * 3 * 8)
	defer C.free(buf)
	arr := unsafe.Slice((*C.uintptr_t)(buf), 3*n)
	for i, r := range runs {
		arr[i], arr[n+i], arr[2*n+i] = C.uintptr_t(r.dev), C.uintptr_t(r.host), C.uintptr_t(r.n)
	}
	dir := C.int(0)
	if toDevice {
		dir = 1
	}
	var done C.int
	r := C.kvf_copies(d.c, d.ctx, s.p, ev.p, dir, &arr[0], &arr[n], (*C.size_t)(unsafe.Pointer(&arr[2*n])), C.int(n), &done)
	runtime.KeepAlive(runs)
	return int(done), d.check(r, "asynchronous copy")
}
