package mooncake

/*
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>

// The Mooncake Transfer Engine C API, declared here in this project's own
// words from its documented signatures (nothing is included from Mooncake).
// transfer_request as the real header declares it (checked against
// Mooncake 3b5a5941): no file_id; target_offset is 8-aligned after
// target_id. layout.go pins the offsets.
typedef struct {
	int opcode;
	void *source;
	int32_t target_id;
	uint64_t target_offset;
	uint64_t length;
} kvf_mc_request;

typedef struct {
	int status;
	uint64_t transferred_bytes;
} kvf_mc_status;

typedef void *(*kvf_mc_create_fn)(const char *, const char *, const char *, uint64_t, int);
typedef int (*kvf_mc_local_fn)(void *, char *, size_t);
typedef void *(*kvf_mc_install_fn)(void *, const char *, void **);
typedef int32_t (*kvf_mc_open_fn)(void *, const char *);
typedef int (*kvf_mc_reg_fn)(void *, void *, size_t, const char *, int);
typedef int (*kvf_mc_unreg_fn)(void *, void *);
typedef uint64_t (*kvf_mc_alloc_fn)(void *, size_t);
typedef int (*kvf_mc_submit_fn)(void *, uint64_t, kvf_mc_request *, size_t);
typedef int (*kvf_mc_status_fn)(void *, uint64_t, size_t, kvf_mc_status *);
typedef int (*kvf_mc_free_fn)(void *, uint64_t);

static void *kvf_mc_create(void *f, const char *meta, const char *name, const char *ip, uint64_t port, int auto_discover) {
	return ((kvf_mc_create_fn)f)(meta, name, ip, port, auto_discover);
}
static int kvf_mc_local(void *f, void *e, char *buf, size_t n) { return ((kvf_mc_local_fn)f)(e, buf, n); }
static void *kvf_mc_install(void *f, void *e, const char *proto) { return ((kvf_mc_install_fn)f)(e, proto, NULL); }
static int32_t kvf_mc_open(void *f, void *e, const char *name) { return ((kvf_mc_open_fn)f)(e, name); }
static int kvf_mc_reg(void *f, void *e, uintptr_t addr, size_t n, const char *loc) {
	return ((kvf_mc_reg_fn)f)(e, (void *)addr, n, loc, 1);
}
static int kvf_mc_unreg(void *f, void *e, uintptr_t addr) { return ((kvf_mc_unreg_fn)f)(e, (void *)addr); }
static uint64_t kvf_mc_alloc(void *f, void *e, size_t n) { return ((kvf_mc_alloc_fn)f)(e, n); }
static int kvf_mc_submit(void *f, void *e, uint64_t b, kvf_mc_request *r, size_t n) { return ((kvf_mc_submit_fn)f)(e, b, r, n); }
static int kvf_mc_status_of(void *f, void *e, uint64_t b, size_t task, int *st, uint64_t *bytes) {
	kvf_mc_status s = {0, 0};
	int rc = ((kvf_mc_status_fn)f)(e, b, task, &s);
	*st = s.status;
	*bytes = s.transferred_bytes;
	return rc;
}
static int kvf_mc_free(void *f, void *e, uint64_t b) { return ((kvf_mc_free_fn)f)(e, b); }
static void kvf_mc_set(kvf_mc_request *r, size_t i, uintptr_t src, int32_t seg, uint64_t dst, uint64_t n) {
	r[i].opcode = 1; // write
	r[i].source = (void *)src;
	r[i].target_id = seg;
	r[i].target_offset = dst;
	r[i].length = n;
}
*/
import "C"

import (
	"github.com/hashicorp/go-hclog"

	"fmt"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/dl"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// invalidBatch is the API's "no batch" id (UINT64_MAX).
const invalidBatch = ^uint64(0)

// engine is a loaded library with one transfer engine.
type engine struct {
	lib   *dl.Library
	e     unsafe.Pointer
	cfg   Config
	local string
	// legacyLib: the library predates the acknowledged TCP framing (no
	// v2FramingMark), so over TCP its COMPLETED means queued.
	legacyLib bool
	fn        struct {
		local, open, reg, unreg, alloc, submit, status, free unsafe.Pointer
	}
}

// Spec is what the plugin needs from the library. getLocalIpAndPort is
// looked up as optional so that a library that lacks it is refused as an
// unsupported version (one line naming it) rather than as a foreign file:
// it marks the five-argument createTransferEngine that this plugin calls.
var Spec = dl.Spec{
	What: "mooncake", EnvVar: EnvLib, Names: []string{"libtransfer_engine.so"},
	Required: []string{"createTransferEngine", "installTransport", "openSegment", "registerLocalMemory",
		"unregisterLocalMemory", "allocateBatchID", "submitTransfer", "getTransferStatus", "freeBatchID"},
	Optional: []string{"getLocalIpAndPort", v2FramingMark, "openSegmentNoCache", "closeSegment", "registerLocalMemoryBatch", "syncSegmentCache"},
}

// v2FramingMark is the symbol that says the library has the acknowledged
// TCP framing (COMPLETED means applied at the destination). Read in
// Mooncake's public history: the framing landed in de58b58bd (#2850,
// 2026-07-13); getNicLoadStats in ac0108389 (#2996, 2026-07-20), after it,
// and both are first in a release at v0.3.12 (v0.3.11.post1 has neither).
// showLinks, also new in v0.3.12, predates the framing and would admit a
// library without it. A library lacking the mark speaks legacy framing
// whatever the configuration says.
const v2FramingMark = "getNicLoadStats"

// Load loads the library named by the environment and starts an engine.
func Load(cfg Config, getenv func(string) string, _ hclog.Logger) (nocancel.Backend, error) {
	lib, err := dl.Load(Spec, getenv)
	if err != nil {
		return nil, err
	}
	if !lib.Has("getLocalIpAndPort") {
		lib.Close()
		return nil, lib.Refuse(Spec, "no getLocalIpAndPort: an engine older than the 2025 C API (createTransferEngine with auto_discover), which this plugin cannot drive")
	}
	g := &engine{lib: lib, cfg: cfg, legacyLib: !lib.Has(v2FramingMark)}
	g.fn.local, g.fn.open, g.fn.reg, g.fn.unreg = lib.Sym("getLocalIpAndPort"), lib.Sym("openSegment"), lib.Sym("registerLocalMemory"), lib.Sym("unregisterLocalMemory")
	g.fn.alloc, g.fn.submit, g.fn.status, g.fn.free = lib.Sym("allocateBatchID"), lib.Sym("submitTransfer"), lib.Sym("getTransferStatus"), lib.Sym("freeBatchID")
	meta, host, proto := C.CString(cfg.Metadata), C.CString(cfg.Host), C.CString(cfg.Protocol)
	defer C.free(unsafe.Pointer(meta))
	defer C.free(unsafe.Pointer(host))
	defer C.free(unsafe.Pointer(proto))
	discover := C.int(0)
	if cfg.Protocol == "rdma" {
		discover = 1 // let the engine find its NICs
	}
	g.e = C.kvf_mc_create(lib.Sym("createTransferEngine"), meta, host, host, 0, discover)
	if g.e == nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "mooncake: createTransferEngine(%q, %q) failed (metadata server reachable? see the library's log)", cfg.Metadata, cfg.Host)
	}
	if C.kvf_mc_install(lib.Sym("installTransport"), g.e, proto) == nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "mooncake: installTransport(%q) failed", cfg.Protocol)
	}
	buf := make([]byte, 256)
	if rc := C.kvf_mc_local(g.fn.local, g.e, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))); rc != 0 {
		return nil, errdefs.Errorf(errdefs.Unavailable, "mooncake: getLocalIpAndPort: rc %d", int(rc))
	}
	g.local = C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	return g, nil
}

func (g *engine) Name() string      { return "mooncake" }
func (g *engine) LocalName() string { return g.local }

// Version names the library and, for a library older than the
// acknowledged framing, that its TCP writes end InDoubt.
func (g *engine) Version() string {
	v := "c-api (" + g.lib.Path + ")"
	if g.legacyLib {
		v += "; legacy TCP framing (no " + v2FramingMark + ": older than Mooncake v0.3.12): TCP writes end InDoubt"
	}
	return v
}

// Framing is what the library is, downgraded by configuration: a library
// without the mark is legacy whatever the configuration says.
func (g *engine) Framing() string {
	if g.legacyLib && g.cfg.Protocol == "tcp" {
		return "legacy"
	}
	return g.cfg.framing()
}

// Confirms: over RDMA a COMPLETED write was acknowledged by the remote NIC;
// over TCP only when both ends speak the v2 framing (the server acknowledges
// after applying) and this library has it. Legacy framing reports
// COMPLETED once the bytes are queued.
func (g *engine) Confirms(peer string) bool {
	return g.cfg.Protocol == "rdma" || (g.Framing() == "v2" && peer == "v2")
}

func (g *engine) Register(addr uintptr, n uint64) error {
	loc := C.CString(g.cfg.Location)
	defer C.free(unsafe.Pointer(loc))
	if rc := C.kvf_mc_reg(g.fn.reg, g.e, C.uintptr_t(addr), C.size_t(n), loc); rc != 0 {
		return errdefs.Errorf(classOf(int(rc)), "mooncake: registerLocalMemory: %s", rcName(int(rc)))
	}
	return nil
}

func (g *engine) Unregister(addr uintptr) error {
	if rc := C.kvf_mc_unreg(g.fn.unreg, g.e, C.uintptr_t(addr)); rc != 0 {
		return errdefs.Errorf(classOf(int(rc)), "mooncake: unregisterLocalMemory: %s", rcName(int(rc)))
	}
	return nil
}

// Metadata: Mooncake exchanges none through kvfence (P2PHANDSHAKE or etcd
// carry its own).
func (g *engine) Metadata() []byte { return nil }

func (g *engine) Open(name string, _ []byte) (nocancel.Segment, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	id := C.kvf_mc_open(g.fn.open, g.e, cs)
	if id < 0 {
		return 0, errdefs.Errorf(errdefs.Unavailable, "mooncake: openSegment(%q) failed", name)
	}
	return nocancel.Segment(id), nil
}

// Submit allocates a batch and submits the writes. Only a refused
// allocateBatchID is an error (nothing was submitted). Once submitTransfer
// was called a refusal is a *nocancel.SubmitRefused with the batch: over
// RDMA the library posts slices as they accumulate (the submit watermark)
// and can still refuse a later one (AddressNotRegistered, a device not
// active), so part of the batch may be on the wire. The batch is then kept
// and freed only once every task was polled terminal.
func (g *engine) Submit(seg nocancel.Segment, ws []nocancel.Write) (nocancel.Job, error) {
	b := uint64(C.kvf_mc_alloc(g.fn.alloc, g.e, C.size_t(len(ws))))
	if b == invalidBatch {
		return 0, errdefs.Errorf(errdefs.ResourceExhausted, "mooncake: allocateBatchID(%d) failed", len(ws))
	}
	reqs := (*C.kvf_mc_request)(C.calloc(C.size_t(len(ws)), C.size_t(unsafe.Sizeof(C.kvf_mc_request{}))))
	defer C.free(unsafe.Pointer(reqs))
	for i, w := range ws {
		C.kvf_mc_set(reqs, C.size_t(i), C.uintptr_t(w.Src), C.int32_t(seg), C.uint64_t(w.Dst), C.uint64_t(w.Length))
	}
	if rc := C.kvf_mc_submit(g.fn.submit, g.e, C.uint64_t(b), reqs, C.size_t(len(ws))); rc != 0 {
		return nocancel.Job(b), &nocancel.SubmitRefused{Job: nocancel.Job(b),
			Err: errdefs.Errorf(classOf(int(rc)), "mooncake: submitTransfer: %s", rcName(int(rc)))}
	}
	return nocancel.Job(b), nil
}

func (g *engine) Poll(j nocancel.Job, task int) (nocancel.Task, error) {
	var st C.int
	var bytes C.uint64_t
	if rc := C.kvf_mc_status_of(g.fn.status, g.e, C.uint64_t(j), C.size_t(task), &st, &bytes); rc != 0 {
		return nocancel.Task{State: nocancel.Unknown}, fmt.Errorf("getTransferStatus: %s", rcName(int(rc)))
	}
	return nocancel.Task{State: StateOf(int(st)), Reported: uint64(bytes)}, nil
}

// Free returns an error while the library answers BatchBusy.
func (g *engine) Free(j nocancel.Job) error {
	if rc := C.kvf_mc_free(g.fn.free, g.e, C.uint64_t(j)); rc != 0 {
		return errdefs.Errorf(errdefs.Unavailable, "mooncake: freeBatchID: %s", rcName(int(rc)))
	}
	return nil
}

// The C API's structs cross the library boundary by value and by array, so
// their layout must be the real header's (x86-64 and AArch64, LP64):
// transfer_request {opcode 0, source 8, target_id 16, target_offset 24,
// length 32; size 40} and transfer_status {status 0, transferred_bytes 8;
// size 16}, as read in Mooncake 3b5a5941's transfer_engine_c.h and run
// against its libtransfer_engine.so. Each line below fails to compile if
// the declaration above drifts (a negative array length).
var (
	_ [unsafe.Offsetof(C.kvf_mc_request{}.source) - 8]struct{}
	_ [8 - unsafe.Offsetof(C.kvf_mc_request{}.source)]struct{}
	_ [unsafe.Offsetof(C.kvf_mc_request{}.target_id) - 16]struct{}
	_ [16 - unsafe.Offsetof(C.kvf_mc_request{}.target_id)]struct{}
	_ [unsafe.Offsetof(C.kvf_mc_request{}.target_offset) - 24]struct{}
	_ [24 - unsafe.Offsetof(C.kvf_mc_request{}.target_offset)]struct{}
	_ [unsafe.Offsetof(C.kvf_mc_request{}.length) - 32]struct{}
	_ [32 - unsafe.Offsetof(C.kvf_mc_request{}.length)]struct{}
	_ [unsafe.Sizeof(C.kvf_mc_request{}) - 40]struct{}
	_ [40 - unsafe.Sizeof(C.kvf_mc_request{})]struct{}
	_ [unsafe.Offsetof(C.kvf_mc_status{}.transferred_bytes) - 8]struct{}
	_ [8 - unsafe.Offsetof(C.kvf_mc_status{}.transferred_bytes)]struct{}
	_ [unsafe.Sizeof(C.kvf_mc_status{}) - 16]struct{}
	_ [16 - unsafe.Sizeof(C.kvf_mc_status{})]struct{}
)
