package nixl

/*
#include <stdlib.h>

#include "kvf_nixl_capi.h"

// Every call goes through a function pointer typed from the declarations
// in kvf_nixl_capi.h (this project's words for NIXL's documented
// signatures), so a call whose shape drifts from them fails to compile.
// Every call returns a status (0 success, 1 in progress, negative errors).
#define KVF_FN(name) __typeof__(name) *
static int kvf_nx_create_agent(void *f, const char *name, void **a) { return ((KVF_FN(nixl_capi_create_agent))f)(name, a); }
static int kvf_nx_plugin_params(void *f, void *a, const char *p, void **mems, void **params) {
	return ((KVF_FN(nixl_capi_get_plugin_params))f)(a, p, mems, params);
}
static int kvf_nx_create_backend(void *f, void *a, const char *p, void *params, void **b) {
	return ((KVF_FN(nixl_capi_create_backend))f)(a, p, params, b);
}
static int kvf_nx_destroy(void *f, void *h) { return ((KVF_FN(nixl_capi_destroy_params))f)(h); }
static int kvf_nx_create_opt(void *f, void **o) { return ((KVF_FN(nixl_capi_create_opt_args))f)(o); }
static int kvf_nx_opt_add_backend(void *f, void *o, void *b) { return ((KVF_FN(nixl_capi_opt_args_add_backend))f)(o, b); }
// Both descriptor-list constructors take (mem_type, out).
static int kvf_nx_create_dlist(void *f, void **d) { return ((KVF_FN(nixl_capi_create_reg_dlist))f)(KVF_NX_MEM_DRAM, d); }
static int kvf_nx_reg_add(void *f, void *d, uintptr_t addr, size_t n) {
	return ((KVF_FN(nixl_capi_reg_dlist_add_desc))f)(d, addr, n, 0, NULL, 0);
}
static int kvf_nx_xfer_add(void *f, void *d, uintptr_t addr, size_t n) {
	return ((KVF_FN(nixl_capi_xfer_dlist_add_desc))f)(d, addr, n, 0);
}
static int kvf_nx_reg(void *f, void *a, void *d, void *o) { return ((KVF_FN(nixl_capi_register_mem))f)(a, d, o); }
static int kvf_nx_local_md(void *f, void *a, void **data, size_t *n) { return ((KVF_FN(nixl_capi_get_local_md))f)(a, data, n); }
static int kvf_nx_load_md(void *f, void *a, const void *data, size_t n, char **name) {
	return ((KVF_FN(nixl_capi_load_remote_md))f)(a, data, n, name);
}
static int kvf_nx_create_req(void *f, void *a, void *local, void *remote, const char *peer, void **req, void *o) {
	return ((KVF_FN(nixl_capi_create_xfer_req))f)(a, KVF_NX_OP_WRITE, local, remote, peer, req, o);
}
static int kvf_nx_post(void *f, void *a, void *req, void *o) { return ((KVF_FN(nixl_capi_post_xfer_req))f)(a, req, o); }
static int kvf_nx_status(void *f, void *a, void *req) { return ((KVF_FN(nixl_capi_get_xfer_status))f)(a, req); }
static int kvf_nx_release(void *f, void *a, void *req) { return ((KVF_FN(nixl_capi_release_xfer_req))f)(a, req); }
static void kvf_nx_version(void *f, int *major, int *minor, int *patch) { ((KVF_FN(nixl_capi_get_version))f)(major, minor, patch); }
static void kvf_nx_mem_free(void *f, void *p) { ((KVF_FN(nixl_capi_mem_free))f)(p); }

typedef int (*kvf_nx_create_8770_fn)(const char *, const struct kvf_nx_agent_config_8770 *, void **);
typedef int (*kvf_nx_create_v01_fn)(const char *, const struct kvf_nx_agent_config_v01 *, void **);

// The agent nixl_capi_create_agent makes (progress thread on, no listener),
// but with NIXL's own locking (STRICT) and a progress-thread poll timeout:
// with the default delay of 0 the progress thread polls without sleeping
// and burns a core per process (measured: 99% of a CPU, idle). The
// configuration is laid out as the library's API version has it.
static int kvf_nx_create_configured(void *f, int v01, const char *name, uint64_t delay_us, void **a) {
	if (v01) {
		struct kvf_nx_agent_config_v01 c = {true, false, 0, KVF_NX_SYNC_STRICT, 1, delay_us, 100000, false};
		return ((kvf_nx_create_v01_fn)f)(name, &c, a);
	}
	struct kvf_nx_agent_config_8770 c = {true, false, 0, KVF_NX_SYNC_STRICT, 1, delay_us, 100000, false};
	return ((kvf_nx_create_8770_fn)f)(name, &c, a);
}
*/
import "C"

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"unsafe"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/plugins/kit/dl"
	"github.com/kvfence/kvfence/plugins/kit/nocancel"
)

// Spec is what the plugin needs from libnixl_capi.so; a library lacking
// any required symbol is refused. The versioned C API exports
// nixl_capi_get_version (see apiOf); NIXL 8770b655's does not.
var Spec = dl.Spec{
	What: "nixl", EnvVar: EnvLib, Names: []string{"libnixl_capi.so"},
	Required: []string{"nixl_capi_create_agent", "nixl_capi_get_plugin_params", "nixl_capi_create_backend",
		"nixl_capi_destroy_mem_list", "nixl_capi_destroy_params", "nixl_capi_create_opt_args", "nixl_capi_opt_args_add_backend",
		"nixl_capi_create_reg_dlist", "nixl_capi_reg_dlist_add_desc", "nixl_capi_destroy_reg_dlist", "nixl_capi_register_mem",
		"nixl_capi_deregister_mem", "nixl_capi_get_local_md", "nixl_capi_load_remote_md", "nixl_capi_create_xfer_dlist",
		"nixl_capi_xfer_dlist_add_desc", "nixl_capi_destroy_xfer_dlist", "nixl_capi_create_xfer_req",
		"nixl_capi_post_xfer_req", "nixl_capi_get_xfer_status", "nixl_capi_release_xfer_req"},
	Optional: []string{"nixl_capi_destroy_xfer_req", "nixl_capi_invalidate_remote_md", "nixl_capi_create_configured_agent",
		"nixl_capi_get_version", "nixl_capi_mem_free"},
}

// API is the C API layout a library has.
type API struct {
	// Versioned: the library has nixl_capi_get_version (0.1.x here); its
	// configuration has the 0.1 layout and its buffers are released with
	// nixl_capi_mem_free. Otherwise the unversioned 8770b655 layout.
	Versioned           bool
	Major, Minor, Patch int
}

func (a API) String() string {
	if !a.Versioned {
		return "unversioned (NIXL 8770b655 layout)"
	}
	return fmt.Sprintf("%d.%d.%d", a.Major, a.Minor, a.Patch)
}

// apiOf reads the library's API version. Only the two layouts read in
// NIXL's sources are driven: the C API is experimental (its header says
// symbols, types and enum values may change between releases), so any
// other version is refused rather than guessed at.
func apiOf(lib *dl.Library) (API, error) {
	if !lib.Has("nixl_capi_get_version") {
		return API{}, nil
	}
	var ma, mi, pa C.int = -1, -1, -1
	C.kvf_nx_version(lib.Sym("nixl_capi_get_version"), &ma, &mi, &pa)
	api := API{Versioned: true, Major: int(ma), Minor: int(mi), Patch: int(pa)}
	if api.Major != 0 || api.Minor != 1 {
		return api, lib.Refuse(Spec, "C API %v; this plugin drives 0.1.x and the unversioned API of NIXL 8770b655 (the C API is experimental: its layout changes between versions)", api)
	}
	for _, sym := range []string{"nixl_capi_mem_free", "nixl_capi_destroy_xfer_req", "nixl_capi_create_configured_agent"} {
		if !lib.Has(sym) {
			return api, lib.Refuse(Spec, "C API %v without %s, which that version has", api, sym)
		}
	}
	return api, nil
}

type agent struct {
	lib  *dl.Library
	api  API
	log  hclog.Logger
	a    unsafe.Pointer
	opt  unsafe.Pointer
	name string
	cfg  Config

	// call serialises every call into the agent: the agent nixl_capi_create_agent
	// makes has thread sync NONE (not safe from two threads), and the
	// poller and posters call concurrently. Taken before mu, never after.
	call sync.Mutex

	mu    sync.Mutex
	segs  map[string]nocancel.Segment
	names []string // segment -> remote agent name
	jobs  map[nocancel.Job]*job
	next  nocancel.Job
	lens  map[uintptr]uint64 // registered address -> length (NIXL deregisters by descriptor)
}

// job is one NIXL transfer request and the descriptor lists it was made of
// (kept until the request is released).
type job struct {
	req, local, remote unsafe.Pointer
	tasks              int
	// postFailed: post_xfer_req returned an error. The request is polled to
	// its end, but a SUCCESS after a failed post is not trusted (Failed:
	// InDoubt): what the library did with it is unknown.
	postFailed bool
}

func (g *agent) sym(name string) unsafe.Pointer { return g.lib.Sym(name) }

// Load loads the library, refuses an API version it does not know and a
// UCX_TLS that allows shared-memory transports, and starts an agent with
// the UCX backend. log gets what the library's calls report that no
// caller sees (a failed post).
func Load(cfg Config, getenv func(string) string, log hclog.Logger) (nocancel.Backend, error) {
	lib, err := dl.Load(Spec, getenv)
	if err != nil {
		return nil, err
	}
	api, err := apiOf(lib)
	if err != nil {
		lib.Close()
		return nil, err
	}
	if err := CheckUCXTransports(getenv("UCX_TLS")); err != nil {
		return nil, err // before UCX reads it
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	g := &agent{lib: lib, api: api, log: log, cfg: cfg, name: "kvfence-" + hex.EncodeToString(rnd[:]), segs: map[string]nocancel.Segment{}, jobs: map[nocancel.Job]*job{}, lens: map[uintptr]uint64{}}
	cname, cplug := C.CString(g.name), C.CString(cfg.Backend)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cplug))
	if lib.Has("nixl_capi_create_configured_agent") {
		delay := C.uint64_t(cfg.ProgressDelay.Microseconds())
		v01 := C.int(0)
		if api.Versioned {
			v01 = 1
		}
		if rc := C.kvf_nx_create_configured(g.sym("nixl_capi_create_configured_agent"), v01, cname, delay, &g.a); rc != 0 {
			return nil, errdefs.Errorf(errdefs.Unavailable, "nixl: create_configured_agent: %s", statusName(int(rc)))
		}
	} else if rc := C.kvf_nx_create_agent(g.sym("nixl_capi_create_agent"), cname, &g.a); rc != 0 {
		return nil, errdefs.Errorf(errdefs.Unavailable, "nixl: create_agent: %s", statusName(int(rc)))
	}
	var mems, params unsafe.Pointer
	if rc := C.kvf_nx_plugin_params(g.sym("nixl_capi_get_plugin_params"), g.a, cplug, &mems, &params); rc != 0 {
		return nil, errdefs.Errorf(errdefs.Unavailable, "nixl: no %s backend plugin (get_plugin_params: %s); is NIXL_PLUGIN_DIR set?", cfg.Backend, statusName(int(rc)))
	}
	var be unsafe.Pointer
	rc := C.kvf_nx_create_backend(g.sym("nixl_capi_create_backend"), g.a, cplug, params, &be)
	C.kvf_nx_destroy(g.sym("nixl_capi_destroy_mem_list"), mems)
	C.kvf_nx_destroy(g.sym("nixl_capi_destroy_params"), params)
	if rc != 0 {
		return nil, errdefs.Errorf(errdefs.Unavailable, "nixl: create_backend(%s): %s (UCX must be >= 1.19 and built with multi-threading)", cfg.Backend, statusName(int(rc)))
	}
	if rc := C.kvf_nx_create_opt(g.sym("nixl_capi_create_opt_args"), &g.opt); rc != 0 {
		return nil, errdefs.Errorf(errdefs.Internal, "nixl: create_opt_args: %s", statusName(int(rc)))
	}
	if rc := C.kvf_nx_opt_add_backend(g.sym("nixl_capi_opt_args_add_backend"), g.opt, be); rc != 0 {
		return nil, errdefs.Errorf(errdefs.Internal, "nixl: opt_args_add_backend: %s", statusName(int(rc)))
	}
	return g, nil
}

func (g *agent) Name() string    { return "nixl" }
func (g *agent) Version() string { return "c-api " + g.api.String() + " (" + g.lib.Path + ")" }

// memFree releases a buffer the library returned: with nixl_capi_mem_free
// where the API version requires it (its allocator need not be this
// process's malloc), else with free (8770b655 returns malloc'd copies).
func (g *agent) memFree(p unsafe.Pointer) {
	if g.api.Versioned {
		C.kvf_nx_mem_free(g.sym("nixl_capi_mem_free"), p)
		return
	}
	C.free(p)
}
func (g *agent) LocalName() string { return g.name }

// Framing: NIXL's UCX backend completes a write request only after the
// endpoint was flushed, so SUCCESS means the target has the bytes.
func (g *agent) Framing() string        { return "ucx-flushed" }
func (g *agent) Confirms(p string) bool { return p == "ucx-flushed" }

// regList runs fn on a one-descriptor registration list.
func (g *agent) regList(addr uintptr, n uint64, fn string) error {
	g.call.Lock()
	defer g.call.Unlock()
	var d unsafe.Pointer
	if rc := C.kvf_nx_create_dlist(g.sym("nixl_capi_create_reg_dlist"), &d); rc != 0 {
		return errdefs.Errorf(errdefs.Internal, "nixl: create_reg_dlist: %s", statusName(int(rc)))
	}
	defer C.kvf_nx_destroy(g.sym("nixl_capi_destroy_reg_dlist"), d)
	if rc := C.kvf_nx_reg_add(g.sym("nixl_capi_reg_dlist_add_desc"), d, C.uintptr_t(addr), C.size_t(n)); rc != 0 {
		return errdefs.Errorf(classOf(int(rc)), "nixl: reg_dlist_add_desc: %s", statusName(int(rc)))
	}
	if rc := C.kvf_nx_reg(g.sym(fn), g.a, d, g.opt); rc != 0 {
		return errdefs.Errorf(classOf(int(rc)), "nixl: %s: %s", fn, statusName(int(rc)))
	}
	return nil
}

func (g *agent) Register(addr uintptr, n uint64) error {
	if err := g.regList(addr, n, "nixl_capi_register_mem"); err != nil {
		return err
	}
	g.mu.Lock()
	g.lens[addr] = n
	g.mu.Unlock()
	return nil
}

func (g *agent) Unregister(addr uintptr) error {
	g.mu.Lock()
	n := g.lens[addr]
	delete(g.lens, addr)
	g.mu.Unlock()
	return g.regList(addr, n, "nixl_capi_deregister_mem")
}

// Metadata is the agent's metadata, which peers load to reach its memory.
func (g *agent) Metadata() []byte {
	var data unsafe.Pointer
	var n C.size_t
	g.call.Lock()
	defer g.call.Unlock()
	if rc := C.kvf_nx_local_md(g.sym("nixl_capi_get_local_md"), g.a, &data, &n); rc != 0 || data == nil {
		return nil
	}
	defer g.memFree(data)
	return C.GoBytes(data, C.int(n))
}

// Open loads the peer's metadata (again: it grows as the peer registers).
func (g *agent) Open(name string, md []byte) (nocancel.Segment, error) {
	if len(md) == 0 {
		return 0, errdefs.Errorf(errdefs.Unavailable, "nixl: peer %q published no metadata", name)
	}
	var got *C.char
	cmd := C.CBytes(md)
	defer C.free(cmd)
	g.call.Lock()
	rc := C.kvf_nx_load_md(g.sym("nixl_capi_load_remote_md"), g.a, cmd, C.size_t(len(md)), &got)
	g.call.Unlock()
	if rc != 0 {
		return 0, errdefs.Errorf(classOf(int(rc)), "nixl: load_remote_md(%s): %s", name, statusName(int(rc)))
	}
	remote := C.GoString(got)
	g.memFree(unsafe.Pointer(got))
	if remote != name {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "nixl: endpoint names agent %q, its metadata agent %q", name, remote)
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

func (g *agent) xferList(addrs []uintptr, lens []uint64) (unsafe.Pointer, error) {
	var d unsafe.Pointer
	if rc := C.kvf_nx_create_dlist(g.sym("nixl_capi_create_xfer_dlist"), &d); rc != 0 {
		return nil, errdefs.Errorf(errdefs.Internal, "nixl: create_xfer_dlist: %s", statusName(int(rc)))
	}
	for i := range addrs {
		if rc := C.kvf_nx_xfer_add(g.sym("nixl_capi_xfer_dlist_add_desc"), d, C.uintptr_t(addrs[i]), C.size_t(lens[i])); rc != 0 {
			C.kvf_nx_destroy(g.sym("nixl_capi_destroy_xfer_dlist"), d)
			return nil, errdefs.Errorf(classOf(int(rc)), "nixl: xfer_dlist_add_desc: %s", statusName(int(rc)))
		}
	}
	return d, nil
}

// Submit makes one transfer request of the writes and posts it. A request
// NIXL refused to make moved nothing (Post's error); a post that fails is
// a job whose tasks read as failed: the C API folds "not posted" into the
// same backend error as failures after bytes left, so it proves nothing.
func (g *agent) Submit(seg nocancel.Segment, ws []nocancel.Write) (nocancel.Job, error) {
	g.mu.Lock()
	if int(seg) < 1 || int(seg) > len(g.names) {
		g.mu.Unlock()
		return 0, errdefs.Errorf(errdefs.NotFound, "nixl: segment %d", seg)
	}
	peer := g.names[seg-1]
	g.mu.Unlock()
	src, dst, lens := make([]uintptr, len(ws)), make([]uintptr, len(ws)), make([]uint64, len(ws))
	for i, w := range ws {
		src[i], dst[i], lens[i] = w.Src, w.Dst, w.Length
	}
	j := &job{tasks: len(ws)}
	if err := g.makeAndPost(j, peer, src, dst, lens); err != nil {
		return 0, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	g.jobs[g.next] = j
	return g.next, nil
}

// makeAndPost builds the request's descriptor lists, makes the request and
// posts it, holding the call lock.
func (g *agent) makeAndPost(j *job, peer string, src, dst []uintptr, lens []uint64) error {
	g.call.Lock()
	defer g.call.Unlock()
	var err error
	if j.local, err = g.xferList(src, lens); err != nil {
		return err
	}
	if j.remote, err = g.xferList(dst, lens); err != nil {
		g.dropLists(j)
		return err
	}
	cpeer := C.CString(peer)
	defer C.free(unsafe.Pointer(cpeer))
	if rc := C.kvf_nx_create_req(g.sym("nixl_capi_create_xfer_req"), g.a, j.local, j.remote, cpeer, &j.req, g.opt); rc != 0 {
		g.dropLists(j)
		return errdefs.Errorf(classOf(int(rc)), "nixl: create_xfer_req: %s", statusName(int(rc)))
	}
	// A failed post is still a job: the C API folds "not posted" into the
	// same BACKEND error as a failure after bytes left, so the request is
	// polled to its end like any other. Its result is logged: it is the
	// only trace of why the batch ends InDoubt.
	if rc := C.kvf_nx_post(g.sym("nixl_capi_post_xfer_req"), g.a, j.req, g.opt); rc != C.KVF_NX_SUCCESS && rc != C.KVF_NX_IN_PROG {
		j.postFailed = true
		g.log.Warn("nixl: post_xfer_req failed; the request is kept and polled (its bytes may have left)", "peer", peer, "status", statusName(int(rc)))
	}
	return nil
}

func (g *agent) dropLists(j *job) {
	for _, d := range []unsafe.Pointer{j.local, j.remote} {
		if d != nil {
			C.kvf_nx_destroy(g.sym("nixl_capi_destroy_xfer_dlist"), d)
		}
	}
}

// Poll reads the request's status; NIXL has one status per request, so
// every task of it reads the same.
func (g *agent) Poll(id nocancel.Job, _ int) (nocancel.Task, error) {
	g.mu.Lock()
	j := g.jobs[id]
	g.mu.Unlock()
	if j == nil {
		return nocancel.Task{State: nocancel.Unknown}, errdefs.Errorf(errdefs.NotFound, "nixl: job %d", id)
	}
	g.call.Lock()
	st := C.kvf_nx_status(g.sym("nixl_capi_get_xfer_status"), g.a, j.req)
	g.call.Unlock()
	state := StateOf(int(st))
	if j.postFailed && state == nocancel.Completed {
		state = nocancel.Failed
	}
	return nocancel.Task{State: state}, nil
}

// Free releases the request. Only called once every task is terminal:
// releasing a request in flight does not stop it (measured).
func (g *agent) Free(id nocancel.Job) error {
	g.mu.Lock()
	j := g.jobs[id]
	delete(g.jobs, id)
	g.mu.Unlock()
	if j == nil {
		return nil
	}
	g.call.Lock()
	defer g.call.Unlock()
	if rc := C.kvf_nx_release(g.sym("nixl_capi_release_xfer_req"), g.a, j.req); rc != 0 {
		g.mu.Lock()
		g.jobs[id] = j
		g.mu.Unlock()
		return errdefs.Errorf(errdefs.Unavailable, "nixl: release_xfer_req: %s", statusName(int(rc)))
	}
	if g.lib.Has("nixl_capi_destroy_xfer_req") {
		C.kvf_nx_destroy(g.sym("nixl_capi_destroy_xfer_req"), j.req)
	}
	g.dropLists(j)
	return nil
}

// The agent configuration crosses the library boundary by pointer, so its
// layout must be the library's (LP64). NIXL 8770b655: enable_prog_thread 0,
// enable_listen_thread 1, listen_port (int) 4, thread_sync 8, num_workers
// 12, pthr_delay_us 16, lthr_delay_us 24, capture_telemetry 32; size 40.
// C API 0.1: listen_port (uint16_t) 2, thread_sync 4, num_workers 8, the
// rest as before. Each pair of lines fails to compile if a declaration in
// kvf_nixl_capi.h drifts.
type (
	config8770 = C.struct_kvf_nx_agent_config_8770
	configV01  = C.struct_kvf_nx_agent_config_v01
)

var (
	_ [unsafe.Offsetof(config8770{}.listen_port) - 4]struct{}
	_ [4 - unsafe.Offsetof(config8770{}.listen_port)]struct{}
	_ [unsafe.Offsetof(config8770{}.thread_sync) - 8]struct{}
	_ [8 - unsafe.Offsetof(config8770{}.thread_sync)]struct{}
	_ [unsafe.Offsetof(config8770{}.num_workers) - 12]struct{}
	_ [12 - unsafe.Offsetof(config8770{}.num_workers)]struct{}
	_ [unsafe.Offsetof(config8770{}.pthr_delay_us) - 16]struct{}
	_ [16 - unsafe.Offsetof(config8770{}.pthr_delay_us)]struct{}
	_ [unsafe.Offsetof(config8770{}.capture_telemetry) - 32]struct{}
	_ [32 - unsafe.Offsetof(config8770{}.capture_telemetry)]struct{}
	_ [unsafe.Sizeof(config8770{}) - 40]struct{}
	_ [40 - unsafe.Sizeof(config8770{})]struct{}

	_ [unsafe.Offsetof(configV01{}.listen_port) - 2]struct{}
	_ [2 - unsafe.Offsetof(configV01{}.listen_port)]struct{}
	_ [unsafe.Offsetof(configV01{}.thread_sync) - 4]struct{}
	_ [4 - unsafe.Offsetof(configV01{}.thread_sync)]struct{}
	_ [unsafe.Offsetof(configV01{}.num_workers) - 8]struct{}
	_ [8 - unsafe.Offsetof(configV01{}.num_workers)]struct{}
	_ [unsafe.Offsetof(configV01{}.pthr_delay_us) - 16]struct{}
	_ [16 - unsafe.Offsetof(configV01{}.pthr_delay_us)]struct{}
	_ [unsafe.Offsetof(configV01{}.capture_telemetry) - 32]struct{}
	_ [32 - unsafe.Offsetof(configV01{}.capture_telemetry)]struct{}
	_ [unsafe.Sizeof(configV01{}) - 40]struct{}
	_ [40 - unsafe.Sizeof(configV01{})]struct{}
)
