package gpumem

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// directChildEnv makes this test binary the plugin-side child of
// TestDirectExportReachesPluginProcess (TestMain then builds nothing).
const directChildEnv = "KVFENCE_DIRECT_CHILD"

// TestDirectChild is that child: it imports the exported buffer as a
// plugin's RegisterMemory does (sdk.ImportDMABuf, over SCM_RIGHTS), reads
// engine page 5 and writes engine page 9, addressed by page index. The
// fake's dma-buf is a memfd, so plain pread/pwrite stand in for the NIC.
func TestDirectChild(t *testing.T) {
	path := os.Getenv(directChildEnv)
	if path == "" {
		t.Skip("the plugin-side child of TestDirectExportReachesPluginProcess: run by it in another process")
	}
	desc := sdk.MemoryDesc{Kind: sdk.MemoryDMABuf, Path: path}
	_, _ = fmt.Sscan(os.Getenv("KVFENCE_DIRECT_REGION"), &desc.Offset, &desc.Size)
	f, err := sdk.ImportDMABuf(desc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 16)
	if _, err := f.ReadAt(b, int64(desc.Offset)+5*halfPage); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("written by the plugin"), int64(desc.Offset)+9*halfPage); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("direct-child read %q\n", b)
}

// TestDirectExportReachesPluginProcess: an engine buffer in (fake) GPU
// memory, exported with cuMemGetHandleForAddressRange and shared over
// SCM_RIGHTS, is the very memory another process reads and writes at the
// engine's page offsets.
func TestDirectExportReachesPluginProcess(t *testing.T) {
	fakeOnly(t) // a real dma-buf has no read(2); the real-driver run is gpu-check's direct step
	dev := openFake(t, Options{})
	eng := newGPUEngine(t, dev)
	for p := range engPages {
		eng.write(t, p, 0, content(7, p, 0))
	}
	x, err := dev.ExportBuffer(eng.bufs[0], engPages)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	desc := x.Desc()
	if desc.Device != "0000:18:00.0" {
		t.Fatalf("the descriptor names device %q, not the GPU's PCI bus id", desc.Device)
	}
	if off, err := x.PageOffset(engPages); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("PageOffset past the buffer: %d, %v", off, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDirectChild$", "-test.v")
	cmd.Env = append(os.Environ(), directChildEnv+"="+desc.Path, fmt.Sprintf("KVFENCE_DIRECT_REGION=%d %d", desc.Offset, desc.Size))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("direct-child read %q", content(7, 5, 0)[:16]); !strings.Contains(string(out), want) {
		t.Fatalf("child did not read engine page 5: want %s in\n%s", want, out)
	}
	got := eng.read(t, 9, 0)
	if !bytes.HasPrefix(got, []byte("written by the plugin")) {
		t.Fatalf("engine page 9 holds %.24q, not the plugin's write", got)
	}
	for _, p := range []int{8, 10} {
		if !bytes.Equal(eng.read(t, p, 0), content(7, p, 0)) {
			t.Fatalf("engine page %d changed", p)
		}
	}
}

// hostOnly declares only host-shared memory, as Mooncake, NIXL and MORI
// do (plugins/kit/nocancel).
type hostOnly struct{ sdk.Transport }

func (h hostOnly) Info(ctx context.Context) (sdk.Info, error) {
	info, err := h.Transport.Info(ctx)
	info.Capabilities.MemoryKinds = []sdk.MemoryKind{sdk.MemoryHostShared}
	return info, err
}

// TestDirectRegisterByDeclaredKinds: a transport that does not declare the
// dmabuf memory kind is refused at registration time with the reason,
// before any descriptor reaches it; the TCP reference plugin (a real
// plugin process) declares dmabuf and registers the fake driver's dma-buf,
// which the CPU can map (a real GPU's would be refused: plugins/tcp).
func TestDirectRegisterByDeclaredKinds(t *testing.T) {
	fakeOnly(t) // the real driver's allocations need not be host-page aligned
	dev := openFake(t, Options{})
	eng := newGPUEngine(t, dev)
	x, err := dev.ExportBuffer(eng.bufs[0], engPages)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	pl, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	ids, err := RegisterDirect(context.Background(), hostOnly{pl.Transport()}, []*DirectBuffer{x})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "host-shared") || !strings.Contains(err.Error(), "staged mode") {
		t.Fatalf("host-shared-only transport in direct mode: %v, %v; want FailedPrecondition naming its memory kinds", ids, err)
	}
	if served, _ := x.share.Served(); served != 0 {
		t.Fatalf("the dma-buf was handed to a plugin that cannot use it (%d times)", served)
	}
	if ids, err = RegisterDirect(context.Background(), pl.Transport(), []*DirectBuffer{x}); err != nil || len(ids) != 1 {
		t.Fatalf("TCP plugin with the fake driver's (mappable) dma-buf: %v, %v", ids, err)
	}
	if served, _ := x.share.Served(); served != 1 {
		t.Fatalf("the dma-buf was handed over %d times, want 1", served)
	}
}

// TestExportRefusals: what cannot be exported is refused with its class.
func TestExportRefusals(t *testing.T) {
	fakeOnly(t)
	dev := openFake(t, Options{})
	eng := newGPUEngine(t, dev)
	b := eng.bufs[0]
	for _, c := range []struct {
		name  string
		buf   Buffer
		pages int
	}{
		{"unaligned base", Buffer{Base: b.Base + 64, PageBytes: halfPage}, 4},
		{"unaligned size", Buffer{Base: b.Base, PageBytes: 1000}, 3},
		{"no pages", b, 0},
		{"host memory", Buffer{Base: 1 << 20, PageBytes: halfPage}, 2},
	} {
		if _, err := dev.ExportBuffer(c.buf, c.pages); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want InvalidArgument", c.name, err)
		}
	}
	// Per-layer buffers must hold as many pages each: a page index names
	// the same page in every one.
	var xs []*DirectBuffer
	for i, n := range []int{8, 4} {
		x, err := dev.ExportBuffer(eng.bufs[i], n)
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		xs = append(xs, x)
	}
	if _, err := EngineBuffers(xs); !errdefs.IsInvalidArgument(err) {
		t.Errorf("buffers of 8 and 4 pages: %v, want InvalidArgument", err)
	}
	if _, err := EngineBuffers(nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no buffers: %v, want InvalidArgument", err)
	}
	old := filepath.Join(testDir, "libfakecuda-nodmabuf.so")
	if out, err := exec.Command("gcc", "-Wall", "-shared", "-fPIC", "-O1", "-pthread", "-DFAKECUDA_NO_DMABUF", "-o", old, "testdata/fakecuda.c").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	od, err := Open(Options{Library: old})
	if err != nil {
		t.Fatal(err)
	}
	defer od.Close()
	base, err := od.Alloc(engPages * halfPage)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := od.ExportBuffer(Buffer{Base: base, PageBytes: halfPage}, engPages); !errdefs.IsFailedPrecondition(err) ||
		!strings.Contains(err.Error(), "cuMemGetHandleForAddressRange") {
		t.Fatalf("a driver without dma-buf export: %v, want FailedPrecondition naming the call", err)
	}
}

// enginePages is decode's engine page allocator in direct mode. It
// remembers which request each page was last lent to, and counts a page
// lent again while that request's exposure is still open: in direct mode
// the exposure is the NIC's permission to write that very page, so such a
// page can receive the old request's late writes over the new one's KV.
type enginePages struct {
	mu         sync.Mutex
	free       []int
	holder     map[int]*DirectReceiver
	reusedOpen int
	// refusedLent: exposures the core refused because a page was still
	// lent (the engine reused it too early); verified: pages read back.
	refusedLent, verified int
	// late: engine pages found written when taken (they were zeroed when
	// given back); heldSeen: aborted requests whose bytes were in their
	// engine pages when the hold ended.
	late     int
	heldSeen map[int]bool
}

// checkFree counts the pages of idx, just taken, that are not zero: a
// write landed while they were free.
func (e *enginePages) checkFree(t *testing.T, eng *directEngine, idx []int) {
	for _, p := range idx {
		if !bytes.Equal(eng.page(t, p), make([]byte, 2*halfPage)) {
			e.mu.Lock()
			e.late++
			e.mu.Unlock()
		}
	}
}

// release gives request k's pages back once free: for an aborted request
// it first looks for its bytes in them (writes that landed while held),
// then the engine zeroes them.
func (e *enginePages) release(t *testing.T, eng *directEngine, idx []int, k int, aborted bool) {
	for _, p := range idx {
		if aborted && bytes.Contains(eng.page(t, p), []byte(fmt.Sprintf("r%04d ", k))) {
			e.mu.Lock()
			e.heldSeen[k] = true
			e.mu.Unlock()
		}
		eng.scrub(t, p)
	}
	e.give(idx)
}

// seen is how many of reqs had bytes in their engine pages at release.
func (e *enginePages) seen(reqs map[int]bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for k := range reqs {
		if e.heldSeen[k] {
			n++
		}
	}
	return n
}

// init exposes idx for r and lends the pages to it; false to try again
// (decode full, or a page still lent: counted).
func (e *enginePages) init(r *DirectReceiver, idx []int) bool {
	_, err := r.Init(idx, []core.RankID{1})
	e.mu.Lock()
	defer e.mu.Unlock()
	if errdefs.IsFailedPrecondition(err) {
		e.refusedLent++
	}
	if err != nil {
		return false
	}
	for _, p := range idx {
		e.holder[p] = r
	}
	return true
}

// take pops n pages (last given, first taken: a page freed too early is
// reused at once, as a busy engine would), or nil when too few are free.
func (e *enginePages) take(n int) []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.free) < n {
		return nil
	}
	got := append([]int(nil), e.free[len(e.free)-n:]...)
	e.free = e.free[:len(e.free)-n]
	for _, p := range got {
		if h := e.holder[p]; h != nil && !h.rv.Released() {
			e.reusedOpen++
		}
	}
	return got
}

func (e *enginePages) give(ps []int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.free = append(e.free, ps...)
}
