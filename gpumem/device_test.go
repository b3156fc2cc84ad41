package gpumem

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

func TestNoDriverIsRefusedClassified(t *testing.T) {
	fakeOnly(t)
	_, err := Open(Options{Library: "/nonexistent/libcuda.so.1"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Fatalf("missing driver: %v, want FailedPrecondition naming the library", err)
	}
	_, err = Open(Options{Library: "libc.so.6"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cuInit") {
		t.Fatalf("a library that is not a driver: %v, want FailedPrecondition naming cuInit", err)
	}
	// A driver that finds no device (a second copy: its own instance).
	nodev := filepath.Join(testDir, "libfakecuda-nodev.so")
	if out, err := exec.Command("cp", fakeLib, nodev).CombinedOutput(); err != nil {
		t.Fatal(string(out))
	}
	t.Setenv("FAKECUDA_NO_DEVICE", "1")
	_, err = Open(Options{Library: nodev})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CUDA_ERROR_NO_DEVICE") {
		t.Fatalf("no device: %v, want FailedPrecondition with CUDA_ERROR_NO_DEVICE", err)
	}
	_, err = Open(Options{Library: fakeLib, ChunkBytes: 1000})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("chunk of 1000 bytes: %v, want InvalidArgument", err)
	}
}

// The fake's device memory is mapped PROT_NONE where the host sees it: a
// host touch faults, as on a GPU. So every copy in these tests went through
// the driver.
func TestHostTouchOfDeviceMemoryFaults(t *testing.T) {
	fakeOnly(t)
	d := openFake(t, Options{})
	p, err := d.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if !d.IsDevice(p) {
		t.Fatal("allocated memory is not device memory")
	}
	host := make([]byte, 8)
	if d.IsDevice(uintptr(unsafe.Pointer(&host[0]))) {
		t.Fatal("Go memory reported as device memory")
	}
	faulted := func() (f bool) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { f = recover() != nil }()
		// The device address as a pointer (read through p's own memory, so the
		// conversion is not a uintptr one); the point: reading it must fault.
		_ = *(*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p)))
		return false
	}()
	if !faulted {
		t.Fatal("a host read of device memory did not fault")
	}
	op, err := d.Gather([]Piece{{Device: uintptr(unsafe.Pointer(&host[0])), Host: make([]byte, 8)}})
	if err == nil {
		err = op.Wait()
	}
	if !errdefs.IsInvalidArgument(err) || (op != nil && op.Copies() != 0) {
		t.Fatalf("gather from host memory: %v, want InvalidArgument and no copy", err)
	}
	if _, err := d.Scatter([]Piece{{Device: 0, Host: host}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("scatter to address 0: %v, want InvalidArgument at once", err)
	}
}

// layout is a device buffer of pages and a host image of what it holds.
type layout struct {
	base  uintptr
	pageB int
	image []byte
}

func newLayout(t testing.TB, d *Device, pages, pageB int, seed uint64) *layout {
	t.Helper()
	base, err := d.Alloc(int64(pages * pageB))
	if err != nil {
		t.Fatal(err)
	}
	l := &layout{base: base, pageB: pageB, image: make([]byte, pages*pageB)}
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range l.image {
		l.image[i] = byte(r.Uint32())
	}
	if err := d.CopyToDevice(base, l.image); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *layout) page(i int) uintptr { return l.base + uintptr(i*l.pageB) }

// runsOf counts runs of consecutive page indices.
func runsOf(idx []int) int {
	n := 0
	for i := range idx {
		if i == 0 || idx[i] != idx[i-1]+1 {
			n++
		}
	}
	return n
}

func TestGatherScatterEveryPageOneCopyPerRun(t *testing.T) {
	d := openFake(t, Options{ChunkBytes: 1 << 20, Chunks: 2})
	const pages, pageB = 256, 4096
	src := newLayout(t, d, pages, pageB, 1)
	idx := []int{3, 4, 5, 6, 40, 41, 7, 100, 101, 102, 103, 104, 0, 255, 254}
	host := make([][]byte, len(idx))
	var pieces []Piece
	for i, p := range idx {
		host[i] = make([]byte, pageB)
		pieces = append(pieces, Piece{Device: src.page(p), Host: host[i]})
	}
	before := d.Counter("fakecuda_async_copies")
	op, err := d.Gather(pieces)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
	for i, p := range idx {
		if !bytes.Equal(host[i], src.image[p*pageB:(p+1)*pageB]) {
			t.Fatalf("gathered page %d (engine page %d) differs", i, p)
		}
	}
	if got, want := d.Counter("fakecuda_async_copies")-before, int64(runsOf(idx)); (before >= 0 && got != want) || op.Copies() != int(want) {
		t.Fatalf("%d copies (op says %d) for %d runs", got, op.Copies(), want)
	}
	// Scatter the gathered pages to another buffer in reverse order.
	dst := newLayout(t, d, pages, pageB, 2)
	pieces = pieces[:0]
	for i, p := range idx {
		pieces = append(pieces, Piece{Device: dst.page(pages - 1 - p), Host: host[i]})
	}
	op, err = d.Scatter(pieces)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, pages*pageB)
	if err := d.CopyFromDevice(got, dst.base); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), dst.image...)
	for _, p := range idx {
		q := pages - 1 - p
		copy(want[q*pageB:(q+1)*pageB], src.image[p*pageB:(p+1)*pageB])
	}
	if !bytes.Equal(got, want) {
		t.Fatal("scattered buffer differs from what was asked")
	}
	if n := d.Counter("fakecuda_refused_copies"); n > 0 {
		t.Fatalf("%d asynchronous copies used unpinned host memory", n)
	}
}

// A request bigger than all staging together goes through in chunks, every
// page checked; copies are one per run per chunk.
func TestGatherLargerThanStaging(t *testing.T) {
	d := openFake(t, Options{ChunkBytes: 64 << 10, Chunks: 2})
	const pages, pageB = 512, 4096 // 2 MiB through 128 KiB of staging
	src := newLayout(t, d, pages, pageB, 3)
	host := make([]byte, pages*pageB)
	op, err := d.Gather([]Piece{{Device: src.base, Host: host}})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(host, src.image) {
		t.Fatal("gathered bytes differ")
	}
	if op.Copies() != pages*pageB/(64<<10) {
		t.Fatalf("%d copies, want one per chunk (%d)", op.Copies(), pages*pageB/(64<<10))
	}
}

// A chunk is reused only once its copy is over: a scatter bigger than all
// staging, with the device running each copy 2 ms late, must land exactly
// (a chunk refilled while its copy is queued would carry the next batch's
// bytes into this batch's pages).
func TestScatterReusesNoChunkInFlight(t *testing.T) {
	t.Setenv("FAKECUDA_DELAY_US", "2000")
	d := openFake(t, Options{ChunkBytes: 16 << 10, Chunks: 2})
	const pages, pageB = 64, 4096 // 256 KiB through 32 KiB of staging
	dst := newLayout(t, d, pages, pageB, 5)
	src := newLayout(t, d, pages, pageB, 6).image
	op, err := d.Scatter([]Piece{{Device: dst.base, Host: src}})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(src))
	if err := d.CopyFromDevice(got, dst.base); err != nil {
		t.Fatal(err)
	}
	for p := 0; p < pages; p++ {
		if !bytes.Equal(got[p*pageB:(p+1)*pageB], src[p*pageB:(p+1)*pageB]) {
			t.Fatalf("page %d of the scatter holds other bytes: a staging chunk was reused while its copy was in flight", p)
		}
	}
}

// A chunk whose copy cannot be shown finished (the event's wait fails) is
// withheld for ever; the op fails classified, and later ops go on with
// the chunks left.
func TestChunkOfFailedCopyIsNeverReused(t *testing.T) {
	fakeOnly(t)
	d := openFake(t, Options{ChunkBytes: 16 << 10, Chunks: 2})
	src := newLayout(t, d, 16, 4096, 7)
	gather := func() ([]byte, error) {
		host := make([]byte, len(src.image))
		op, err := d.Gather([]Piece{{Device: src.base, Host: host}})
		if err != nil {
			t.Fatal(err)
		}
		return host, op.Wait()
	}
	failing := func(n int) error { // a gather of n bytes, its event's wait failing
		t.Setenv("FAKECUDA_EVENT_FAIL", "1")
		defer os.Unsetenv("FAKECUDA_EVENT_FAIL")
		op, err := d.Gather([]Piece{{Device: src.base, Host: make([]byte, n)}})
		if err != nil {
			t.Fatal(err)
		}
		return op.Wait()
	}
	err := failing(16 << 10)
	if !errdefs.IsInternal(err) || !strings.Contains(err.Error(), "CUDA_ERROR_LAUNCH_FAILED") {
		t.Fatalf("a failed event wait: %v, want Internal naming the driver's error", err)
	}
	if d.Leaked() != 1 {
		t.Fatalf("%d chunks withheld after one failed batch, want 1", d.Leaked())
	}
	for range 3 { // 64 KiB through the one chunk left
		host, err := gather()
		if err != nil || !bytes.Equal(host, src.image) {
			t.Fatalf("gather after a leak: %v (bytes equal: %v)", err, bytes.Equal(host, src.image))
		}
	}
	if d.Leaked() != 1 {
		t.Fatalf("%d chunks withheld, want still 1", d.Leaked())
	}
	// The last chunk lost: ops fail at once instead of waiting for ever.
	if err := failing(16 << 10); !errdefs.IsInternal(err) || d.Leaked() != 2 {
		t.Fatalf("second failed copy: %v, %d withheld", err, d.Leaked())
	}
	if _, err := gather(); !errdefs.IsInternal(err) || !strings.Contains(err.Error(), "no staging left") {
		t.Fatalf("gather with every chunk withheld: %v, want Internal (no staging left)", err)
	}
}

// Aborts mid-copy: once Cancel returns, no byte reaches the host pieces of a
// gather; a cancelled scatter writes nothing after Done; every page that
// was written holds exactly its source.
func TestCancelMidCopy(t *testing.T) {
	t.Setenv("FAKECUDA_DELAY_US", "2000")
	d := openFake(t, Options{ChunkBytes: 16 << 10, Chunks: 2})
	const pages, pageB = 64, 4096
	src := newLayout(t, d, pages, pageB, 4)
	for round := 0; round < 8; round++ {
		host := bytes.Repeat([]byte{0xAB}, pages*pageB)
		var pieces []Piece
		for p := 0; p < pages; p += 2 { // every other page: one copy each
			pieces = append(pieces, Piece{Device: src.page(p), Host: host[p*pageB : (p+1)*pageB]})
		}
		op, err := d.Gather(pieces)
		if err != nil {
			t.Fatal(err)
		}
		for op.Copies() < round+1 && !op.Ready() {
			runtimeGosched()
		}
		op.Cancel()
		snap := append([]byte(nil), host...)
		<-op.Done()
		if !bytes.Equal(snap, host) {
			t.Fatalf("round %d: bytes reached the host after Cancel returned", round)
		}
		for p := 0; p < pages; p++ {
			got := host[p*pageB : (p+1)*pageB]
			if !bytes.Equal(got, src.image[p*pageB:(p+1)*pageB]) && !bytes.Equal(got, bytes.Repeat([]byte{0xAB}, pageB)) {
				t.Fatalf("round %d: page %d is neither its source nor untouched", round, p)
			}
		}
		if !errdefs.IsUnavailable(op.Err()) {
			t.Fatalf("cancelled op: %v", op.Err())
		}
	}
	if d.Leaked() != 0 {
		t.Fatalf("%d chunks leaked with a working driver", d.Leaked())
	}
}

func runtimeGosched() { runtime.Gosched() }
