package mori

/*
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>

// kvfence's own shim interface (shim/kvfence_mori_shim.h), declared again
// here as function-pointer types so that the plugin loads the shim at run
// time and builds without it.
typedef int (*kvf_mo_abi_fn)(void);
typedef void *(*kvf_mo_open_fn)(const char *, int, const char *, char *, size_t);
typedef int (*kvf_mo_name_fn)(void *, char *, size_t);
typedef int (*kvf_mo_md_fn)(void *, void *, size_t, size_t *);
typedef int (*kvf_mo_reg_fn)(void *, uintptr_t, size_t);
typedef int (*kvf_mo_dereg_fn)(void *, uintptr_t);
typedef int (*kvf_mo_load_fn)(void *, const void *, size_t, char *, size_t);
typedef void *(*kvf_mo_submit_fn)(void *, const char *, const uintptr_t *, const uint64_t *, const uint64_t *, size_t, int *);
typedef int (*kvf_mo_status_fn)(void *, size_t);
typedef int (*kvf_mo_free_fn)(void *);

static int kvf_mo_abi(void *f) { return ((kvf_mo_abi_fn)f)(); }
static void *kvf_mo_open(void *f, const char *h, int p, const char *b, char *e, size_t n) { return ((kvf_mo_open_fn)f)(h, p, b, e, n); }
static int kvf_mo_name(void *f, void *e, char *b, size_t n) { return ((kvf_mo_name_fn)f)(e, b, n); }
static int kvf_mo_md(void *f, void *e, void *b, size_t cap, size_t *n) { return ((kvf_mo_md_fn)f)(e, b, cap, n); }
static int kvf_mo_reg(void *f, void *e, uintptr_t a, size_t n) { return ((kvf_mo_reg_fn)f)(e, a, n); }
static int kvf_mo_dereg(void *f, void *e, uintptr_t a) { return ((kvf_mo_dereg_fn)f)(e, a); }
static int kvf_mo_load(void *f, void *e, const void *md, size_t n, char *name, size_t nn) { return ((kvf_mo_load_fn)f)(e, md, n, name, nn); }
static void *kvf_mo_submit(void *f, void *e, const char *peer, const uintptr_t *s, const uint64_t *d, const uint64_t *l, size_t n, int *err) {
	return ((kvf_mo_submit_fn)f)(e, peer, s, d, l, n, err);
}
static int kvf_mo_status(void *f, void *b, size_t i) { return ((kvf_mo_status_fn)f)(b, i); }
static int kvf_mo_free(void *f, void *b) { return ((kvf_mo_free_fn)f)(b); }
*/
import "C"

import (
	"github.com/hashicorp/go-hclog"

	"sync"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/dl"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// shimABI is the shim interface version this plugin drives.
const shimABI = 1

// Spec is what the plugin needs from the shim.
var Spec = dl.Spec{
	What: "mori", EnvVar: EnvShim, Names: []string{"libkvfence_mori_shim.so"},
	Required: []string{"kvf_mori_abi", "kvf_mori_open", "kvf_mori_name", "kvf_mori_metadata", "kvf_mori_register",
		"kvf_mori_deregister", "kvf_mori_load_peer", "kvf_mori_submit", "kvf_mori_status", "kvf_mori_free"},
}

type engine struct {
	lib  *dl.Library
	e    unsafe.Pointer
	name string

	mu      sync.Mutex
	names   []string
	segs    map[string]nocancel.Segment
	batches map[nocancel.Job]unsafe.Pointer // shim batches (C memory)
	next    nocancel.Job
}

func (g *engine) sym(n string) unsafe.Pointer { return g.lib.Sym(n) }

// Load loads the shim, refuses another interface version, and starts a
// MORI-IO engine.
func Load(cfg Config, getenv func(string) string, _ hclog.Logger) (nocancel.Backend, error) {
	lib, err := dl.Load(Spec, getenv)
	if err != nil {
		return nil, err
	}
	if v := int(C.kvf_mo_abi(lib.Sym("kvf_mori_abi"))); v != shimABI {
		lib.Close()
		return nil, lib.Refuse(Spec, "shim interface %d, this plugin drives %d", v, shimABI)
	}
	g := &engine{lib: lib, segs: map[string]nocancel.Segment{}, batches: map[nocancel.Job]unsafe.Pointer{}}
	host, be := C.CString(cfg.Host), C.CString(cfg.Backend)
	defer C.free(unsafe.Pointer(host))
	defer C.free(unsafe.Pointer(be))
	msg := make([]byte, 256)
	g.e = C.kvf_mo_open(g.sym("kvf_mori_open"), host, C.int(cfg.Port), be, (*C.char)(unsafe.Pointer(&msg[0])), C.size_t(len(msg)))
	if g.e == nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "mori: starting the IO engine failed: %s", C.GoString((*C.char)(unsafe.Pointer(&msg[0]))))
	}
	buf := make([]byte, 256)
	if C.kvf_mo_name(g.sym("kvf_mori_name"), g.e, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))) != 0 {
		return nil, errdefs.Errorf(errdefs.Internal, "mori: engine name")
	}
	g.name = C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	return g, nil
}

func (g *engine) Name() string      { return "mori" }
func (g *engine) Version() string   { return "shim-abi-1 (" + g.lib.Path + ")" }
func (g *engine) LocalName() string { return g.name }

// Framing: an RDMA write's SUCCESS is the remote NIC's acknowledgement.
func (g *engine) Framing() string        { return "rdma-acked" }
func (g *engine) Confirms(p string) bool { return p == "rdma-acked" }

func (g *engine) Register(addr uintptr, n uint64) error {
	if rc := C.kvf_mo_reg(g.sym("kvf_mori_register"), g.e, C.uintptr_t(addr), C.size_t(n)); rc != 0 {
		return errdefs.Errorf(errdefs.Unavailable, "mori: RegisterMemory failed (%d)", int(rc))
	}
	return nil
}

func (g *engine) Unregister(addr uintptr) error {
	if rc := C.kvf_mo_dereg(g.sym("kvf_mori_deregister"), g.e, C.uintptr_t(addr)); rc != 0 {
		return errdefs.Errorf(errdefs.NotFound, "mori: DeregisterMemory failed (%d)", int(rc))
	}
	return nil
}

// Metadata is the engine's and its memory's descriptors (grown as needed).
func (g *engine) Metadata() []byte {
	buf := make([]byte, 64<<10)
	for {
		var n C.size_t
		p := C.malloc(C.size_t(len(buf)))
		rc := C.kvf_mo_md(g.sym("kvf_mori_metadata"), g.e, p, C.size_t(len(buf)), &n)
		if rc == 0 {
			out := C.GoBytes(p, C.int(n))
			C.free(p)
			return out
		}
		C.free(p)
		if uint64(n) <= uint64(len(buf)) || n > 16<<20 {
			return nil
		}
		buf = make([]byte, n)
	}
}

func (g *engine) Open(name string, md []byte) (nocancel.Segment, error) {
	if len(md) == 0 {
		return 0, errdefs.Errorf(errdefs.Unavailable, "mori: peer %q published no metadata", name)
	}
	cmd := C.CBytes(md)
	defer C.free(cmd)
	buf := make([]byte, 256)
	if rc := C.kvf_mo_load(g.sym("kvf_mori_load_peer"), g.e, cmd, C.size_t(len(md)), (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))); rc != 0 {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "mori: loading peer %q's metadata failed (%d)", name, int(rc))
	}
	if got := C.GoString((*C.char)(unsafe.Pointer(&buf[0]))); got != name {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "mori: endpoint names engine %q, its metadata %q", name, got)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.segs[name]; ok {
		return s, nil
	}
	g.names = append(g.names, name)
	g.segs[name] = nocancel.Segment(len(g.names))
	return g.segs[name], nil
}

// Submit starts one MORI write per op; the shim checks every address first
// and starts nothing if one is not inside published memory.
func (g *engine) Submit(seg nocancel.Segment, ws []nocancel.Write) (nocancel.Job, error) {
	g.mu.Lock()
	if int(seg) < 1 || int(seg) > len(g.names) {
		g.mu.Unlock()
		return 0, errdefs.Errorf(errdefs.NotFound, "mori: segment %d", seg)
	}
	peer := C.CString(g.names[seg-1])
	g.mu.Unlock()
	defer C.free(unsafe.Pointer(peer))
	n := C.size_t(len(ws))
	src := (*C.uintptr_t)(C.calloc(n, 8))
	dst := (*C.uint64_t)(C.calloc(n, 8))
	lens := (*C.uint64_t)(C.calloc(n, 8))
	defer C.free(unsafe.Pointer(src))
	defer C.free(unsafe.Pointer(dst))
	defer C.free(unsafe.Pointer(lens))
	s, d, l := unsafe.Slice(src, len(ws)), unsafe.Slice(dst, len(ws)), unsafe.Slice(lens, len(ws))
	for i, w := range ws {
		s[i], d[i], l[i] = C.uintptr_t(w.Src), C.uint64_t(w.Dst), C.uint64_t(w.Length)
	}
	var errc C.int
	b := C.kvf_mo_submit(g.sym("kvf_mori_submit"), g.e, peer, src, dst, lens, n, &errc)
	if b == nil {
		class := errdefs.InvalidArgument
		if errc == -2 {
			class = errdefs.NotFound
		}
		return 0, errdefs.Errorf(class, "mori: writes refused before any started (%d)", int(errc))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	g.batches[g.next] = b
	return g.next, nil
}

func (g *engine) batch(j nocancel.Job) unsafe.Pointer {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.batches[j]
}

func (g *engine) Poll(j nocancel.Job, i int) (nocancel.Task, error) {
	b := g.batch(j)
	if b == nil {
		return nocancel.Task{State: nocancel.Unknown}, errdefs.Errorf(errdefs.NotFound, "mori: job %d", j)
	}
	return nocancel.Task{State: StateOf(int(C.kvf_mo_status(g.sym("kvf_mori_status"), b, C.size_t(i))))}, nil
}

func (g *engine) Free(j nocancel.Job) error {
	b := g.batch(j)
	if b == nil {
		return nil
	}
	if rc := C.kvf_mo_free(g.sym("kvf_mori_free"), b); rc != 0 {
		return errdefs.Errorf(errdefs.Unavailable, "mori: batch busy")
	}
	g.mu.Lock()
	delete(g.batches, j)
	g.mu.Unlock()
	return nil
}
