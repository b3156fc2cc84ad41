package main

// The C ABI's staging of KV buffers in GPU memory, on the fake CUDA driver
// (gpumem/testdata/fakecuda.c, built here with gcc): its device memory is
// PROT_NONE to the host, so any host touch of an engine page crashes the
// test, and every page is checked by copying it back through the driver.

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/internal/stage"
)

var fakeOnce struct {
	sync.Once
	lib string
	err error
}

// fakeDevice builds the fake driver once, points $KVFENCE_CUDA_LIB at it
// (the library's gpumem.Shared opens it) and returns the shared device.
func fakeDevice(t *testing.T) *gpumem.Device {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found: the fake CUDA driver cannot be built")
	}
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvfence-fakecuda-")
		if err != nil {
			fakeOnce.err = err
			return
		}
		fakeOnce.lib = filepath.Join(dir, "libfakecuda.so")
		out, err := exec.Command("gcc", "-Wall", "-shared", "-fPIC", "-O1", "-pthread", "-o", fakeOnce.lib, "../../gpumem/testdata/fakecuda.c").CombinedOutput()
		if err != nil {
			fakeOnce.err = err
			t.Logf("%s", out)
		}
	})
	if fakeOnce.err != nil {
		t.Fatalf("building the fake CUDA driver: %v", fakeOnce.err)
	}
	// Not t.Setenv: gpumem.Shared keeps the device it opened for the process.
	_ = os.Setenv("KVFENCE_CUDA_LIB", fakeOnce.lib)
	d, err := gpumem.Shared()
	if err != nil {
		t.Fatal(err)
	}
	if d.Library() != fakeOnce.lib {
		t.Skipf("the process's device is %s, not the fake", d.Library())
	}
	return d
}

// devBufs allocates n device buffers of pages×item bytes filled by fill
// (nil: zeros) and returns their addresses.
func devBufs(t *testing.T, d *gpumem.Device, n, pages, item int, fill func(buf, page, i int) byte) []uintptr {
	t.Helper()
	out := make([]uintptr, n)
	for b := range out {
		p, err := d.Alloc(int64(pages * item))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Free(p) })
		img := make([]byte, pages*item)
		if fill != nil {
			for i := range img {
				img[i] = fill(b, i/item, i%item)
			}
		}
		if err := d.CopyToDevice(p, img); err != nil {
			t.Fatal(err)
		}
		out[b] = p
	}
	return out
}

// devPtr is a device address as the pointer C hands us (never
// dereferenced by Go; vet's uintptr rule is about Go memory).
func devPtr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

func layoutT(t *testing.T, ptrs []uintptr, lens, items []int64, pageSize int) (uint64, int64) {
	t.Helper()
	ps := make([]unsafe.Pointer, len(ptrs))
	for i, p := range ptrs {
		ps[i] = devPtr(p)
	}
	var h uint64
	var e errBuf
	rc := abi(kvfence_layout_new, unsafe.Pointer(&ps[0]), unsafe.Pointer(&lens[0]), unsafe.Pointer(&items[0]), len(ptrs), pageSize, unsafe.Pointer(&h), e.p())
	if rc != 0 {
		t.Fatalf("layout_new: %d %s", rc, e.Message[:])
	}
	t.Cleanup(func() { abi(kvfence_close, h, nil) })
	return h, rc
}

func waitStage(t *testing.T, fn any, h uint64) {
	t.Helper()
	var e errBuf
	for {
		rc := abi(fn, h, 1000, e.p())
		if rc == 0 {
			return
		}
		if rc < 0 {
			t.Fatalf("staging failed: %d %s", rc, e.Message[:])
		}
	}
}

const (
	gpuPages = 8
	gpuItem  = 1024 // bytes per page index of each buffer: 4 tokens × 256
	gpuPS    = 4
)

func pattern(b, page, i int) byte { return byte(b*131 + page*17 + i*7 + 1) }

// A request's GPU pages gathered on prefill (device → host), sent, and
// scattered on decode (host → device) into other GPU pages: every page
// arrives, the pages not named stay untouched, and every engine byte moved
// through the driver (the host never touches the PROT_NONE device memory).
func TestStagingDeviceBuffersThroughDriver(t *testing.T) {
	d := fakeDevice(t)
	dec, pre := openPairT(t)
	lens := []int64{gpuPages * gpuItem, gpuPages * gpuItem}
	items := []int64{gpuItem, gpuItem}
	src := devBufs(t, d, 2, gpuPages, gpuItem, pattern)
	dst := devBufs(t, d, 2, gpuPages, gpuItem, nil)
	srcL, _ := layoutT(t, src, lens, items, gpuPS)
	dstL, _ := layoutT(t, dst, lens, items, gpuPS)
	from, to := []int32{3, 1, 5}, []int32{6, 0, 2}
	asyncBefore := d.Counter("fakecuda_async_copies")

	var e errBuf
	rv := newReceiverT(t, dec, 31)
	defer abi(kvfence_close, rv, nil)
	ranks := []uint32{1}
	if rc := abi(kvfence_receiver_init, rv, len(from), unsafe.Pointer(&ranks[0]), 1, e.p()); rc != 0 {
		t.Fatalf("receiver_init: %d", rc)
	}
	var sd uint64
	if rc := abi(kvfence_sender_new, pre, 31, 1, unsafe.Pointer(&sd), e.p()); rc != 0 {
		t.Fatalf("sender_new: %d", rc)
	}
	defer abi(kvfence_close, sd, nil)
	if rc := abi(kvfence_sender_init, sd, len(from), e.p()); rc != 0 {
		t.Fatalf("sender_init: %d", rc)
	}
	// Scatter before success is refused: no copy into a GPU page until the
	// request's transfer succeeded.
	if rc := abi(kvfence_receiver_scatter, rv, dstL, unsafe.Pointer(&to[0]), len(to), 1, 0, e.p()); rc == 0 {
		t.Fatal("a scatter before the request succeeded was accepted")
	}
	if rc := abi(kvfence_sender_gather, sd, srcL, unsafe.Pointer(&from[0]), len(from), 0, 1, 0, len(from), len(from), e.p()); rc != 0 {
		t.Fatalf("sender_gather: %d %s", rc, e.Message[:])
	}
	waitStage(t, kvfence_sender_gather_wait, sd)
	if st := abi(kvfence_wait, rv, 60_000); st != 4 {
		t.Fatalf("receiver state %d, want SUCCESS", st)
	}
	if rc := abi(kvfence_receiver_scatter, rv, dstL, unsafe.Pointer(&to[0]), len(to), 1, 0, e.p()); rc != 0 {
		t.Fatalf("receiver_scatter: %d %s", rc, e.Message[:])
	}
	waitStage(t, kvfence_receiver_scatter_done, rv)
	abi(kvfence_receiver_finish, rv, e.p())
	if n := d.Counter("fakecuda_async_copies") - asyncBefore; asyncBefore >= 0 && n <= 0 {
		t.Errorf("%d asynchronous copies: the pages did not move through the driver", n)
	}
	want := map[int32]int32{}
	for i := range to {
		want[to[i]] = from[i]
	}
	for b := range dst {
		img := make([]byte, gpuPages*gpuItem)
		if err := d.CopyFromDevice(img, dst[b]); err != nil {
			t.Fatal(err)
		}
		for p := int32(0); p < gpuPages; p++ {
			got := img[int(p)*gpuItem : int(p+1)*gpuItem]
			exp := make([]byte, gpuItem)
			if f, ok := want[p]; ok {
				for i := range exp {
					exp[i] = pattern(b, int(f), i)
				}
			}
			if !bytes.Equal(got, exp) {
				t.Errorf("buffer %d page %d: wrong bytes (want engine page %v)", b, p, want[p])
			}
		}
	}
}

// A layout may mix host and device buffers (one device buffer, one host):
// each goes its own way, and a buffer only partly device memory is refused.
func TestStagingMixedHostAndDeviceBuffers(t *testing.T) {
	d := fakeDevice(t)
	dev := devBufs(t, d, 1, gpuPages, gpuItem, pattern)
	host := testMem(t).rw[:gpuPages*gpuItem]
	lens := []int64{gpuPages * gpuItem, gpuPages * gpuItem}
	items := []int64{gpuItem, gpuItem}
	layoutT(t, []uintptr{dev[0], uintptr(unsafe.Pointer(&host[0]))}, lens, items, gpuPS)

	var h uint64
	var e errBuf
	p := devPtr(dev[0] + gpuPages*gpuItem - 512)
	long := []int64{gpuPages * gpuItem}
	it := []int64{gpuItem}
	if rc := abi(kvfence_layout_new, unsafe.Pointer(&p), unsafe.Pointer(&long[0]), unsafe.Pointer(&it[0]), 1, gpuPS, unsafe.Pointer(&h), e.p()); rc != codeInvalid {
		t.Errorf("a buffer running off the end of device memory: %d, want InvalidArgument", rc)
		if rc == 0 {
			abi(kvfence_close, h, nil)
		}
	}
}

// FuzzABI's finding: layout_new read its arrays, and wrote *out, without
// a fault guard, so arrays running into a PROT_NONE page killed the
// process. Each is InvalidArgument now, and no handle is left behind.
func TestLayoutNewFaultingArraysAreInvalidArguments(t *testing.T) {
	m := testMem(t)
	var e errBuf
	// The good arrays hold both entries: under -race, checkptr kills the
	// test process on a slice of a Go allocation shorter than n.
	good := []int64{4096, 4096}
	arr := unsafe.Add(m.guard, -8) // one int64 readable, the next faults
	ptr := unsafe.Pointer(&m.rw[0])
	ptrs := []unsafe.Pointer{ptr, ptr}
	live := kvfence_handles_live()
	var h uint64
	for name, args := range map[string][3]unsafe.Pointer{
		"ptrs":  {arr, unsafe.Pointer(&good[0]), unsafe.Pointer(&good[0])},
		"lens":  {unsafe.Pointer(&ptrs[0]), arr, unsafe.Pointer(&good[0])},
		"items": {unsafe.Pointer(&ptrs[0]), unsafe.Pointer(&good[0]), arr},
	} {
		if rc := abi(kvfence_layout_new, args[0], args[1], args[2], 2, 1, unsafe.Pointer(&h), e.p()); rc != codeInvalid {
			t.Errorf("%s running into a PROT_NONE page: %d, want InvalidArgument", name, rc)
		}
	}
	if rc := abi(kvfence_layout_new, unsafe.Pointer(&ptr), unsafe.Pointer(&good[0]), unsafe.Pointer(&good[0]), 1, 1, m.guard, e.p()); rc != codeInvalid {
		t.Errorf("out in a PROT_NONE page: %d, want InvalidArgument", rc)
	}
	if n := kvfence_handles_live(); n != live {
		t.Errorf("%d handles live after the refusals, %d before", n, live)
	}
	// indices takes a *C.int32_t, which a test file cannot name: reflect.
	l := &stage.Layout{Bufs: []stage.Buffer{{Addr: ptr, Len: 4096, Item: 4096}}, PageSize: 1}
	f := reflect.ValueOf(indices)
	out := f.Call([]reflect.Value{reflect.ValueOf(l), reflect.NewAt(f.Type().In(1).Elem(), unsafe.Add(m.guard, -4)), abiArg(f.Type().In(2), 2)})
	if out[1].IsNil() {
		t.Error("page indices running into a PROT_NONE page were read")
	}
}
