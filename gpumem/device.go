package gpumem

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/errdefs"
)

// Options configure a Device. Zero values take the defaults.
type Options struct {
	// Library is the driver library; default $KVFENCE_CUDA_LIB, else
	// libcuda.so.1.
	Library string
	// Ordinal is the CUDA device number (default 0).
	Ordinal int
	// ChunkBytes is one staging chunk (default 4 MiB): a batch of copies
	// fills at most one chunk. Chunks per direction (default 4) bound the
	// copies in flight; staging is 2 × Chunks × ChunkBytes of pinned memory.
	ChunkBytes int64
	Chunks     int
}

func (o Options) withDefaults() Options {
	if o.Library == "" {
		o.Library = libPath()
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = 4 << 20
	}
	if o.Chunks <= 0 {
		o.Chunks = 4
	}
	return o
}

// Device is one GPU's primary context, with a copy stream per direction and
// pinned staging. It is safe for concurrent use.
type Device struct {
	drv   *driver
	opts  Options
	lanes [2]*lane // gather (device → host), scatter (host → device)

	mu     sync.Mutex
	closed bool
}

// Open loads the driver and prepares staging and streams. Without a driver
// or a device it fails with FailedPrecondition naming the library.
func Open(o Options) (*Device, error) {
	o = o.withDefaults()
	if o.ChunkBytes%4096 != 0 || o.ChunkBytes > 1<<30 || o.Chunks > 1024 {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "staging of %d chunks of %d bytes: chunks are multiples of 4096 up to 1 GiB, at most 1024", o.Chunks, o.ChunkBytes)
	}
	drv, err := openDriver(o.Library, o.Ordinal)
	if err != nil {
		return nil, err
	}
	d := &Device{drv: drv, opts: o}
	for i := range d.lanes {
		l, err := newLane(drv, i == 1, o.ChunkBytes, o.Chunks)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.lanes[i] = l
	}
	return d, nil
}

var (
	sharedMu  sync.Mutex
	sharedDev *Device
)

// Shared is the process's Device (opened on first use with default
// options): what code that meets a device pointer in an engine's buffer
// list routes it to. Without a driver it fails with FailedPrecondition, and
// tries again on the next call.
func Shared() (*Device, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedDev != nil {
		return sharedDev, nil
	}
	d, err := Open(Options{})
	if err != nil {
		return nil, err
	}
	sharedDev = d
	return d, nil
}

// Library is the driver library this device was opened from.
func (d *Device) Library() string { return d.drv.lib }

// IsDevice reports whether p is device memory of this driver (CUDA pointer
// attribute MEMORY_TYPE == DEVICE). Host memory, registered or not, is not.
func (d *Device) IsDevice(p uintptr) bool { return p != 0 && d.drv.isDevice(p) }

// Alloc is cuMemAlloc (for tests and the GPU check; engines allocate their own).
func (d *Device) Alloc(n int64) (uintptr, error) { return d.drv.alloc(n) }

// Free is cuMemFree.
func (d *Device) Free(p uintptr) error { return d.drv.free(p) }

// CopyToDevice is a synchronous cuMemcpyHtoD from any host memory.
func (d *Device) CopyToDevice(dst uintptr, src []byte) error { return d.drv.copyHtoD(dst, src) }

// CopyFromDevice is a synchronous cuMemcpyDtoH into any host memory.
func (d *Device) CopyFromDevice(dst []byte, src uintptr) error { return d.drv.copyDtoH(dst, src) }

// Counter reads a counter a test driver exports (-1 when it has none).
func (d *Device) Counter(name string) int64 { return d.drv.counter(name) }

// Leaked is how many staging chunks are withheld for ever because a copy
// into or out of them could not be shown finished.
func (d *Device) Leaked() int { return d.lanes[0].leakedChunks() + d.lanes[1].leakedChunks() }

// Close waits for every accepted operation to finish, then destroys the
// streams. Staging with a leaked chunk stays mapped and pinned.
func (d *Device) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	d.mu.Unlock()
	for _, l := range d.lanes {
		if l != nil {
			l.close()
		}
	}
}

// staging is one mmap, pinned once, cut in chunks.
type staging struct {
	mem    []byte
	chunkB int64
	free   chan int
}

func newStaging(drv *driver, chunkB int64, chunks int) (*staging, error) {
	mem, err := unix.Mmap(-1, 0, int(chunkB)*chunks, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ResourceExhausted, "staging of %d bytes: %v", int(chunkB)*chunks, err)
	}
	if err := drv.register(mem); err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	s := &staging{mem: mem, chunkB: chunkB, free: make(chan int, chunks)}
	for i := 0; i < chunks; i++ {
		s.free <- i
	}
	return s, nil
}

func (s *staging) chunk(i int) []byte {
	off := int64(i) * s.chunkB
	return s.mem[off : off+s.chunkB : off+s.chunkB]
}

func (s *staging) addr(i int, off int64) uintptr {
	return uintptr(unsafe.Pointer(&s.mem[int64(i)*s.chunkB])) + uintptr(off)
}

// DeviceOf is how engine-binding code decides where a buffer lives: the
// process's Device and true when p is device memory of the CUDA driver;
// nil and false when it is not, or when no driver loads (then a buffer
// the engine says is on a GPU is to be refused with Shared's error).
func DeviceOf(p uintptr) (*Device, bool) {
	d, err := Shared()
	if err != nil || !d.IsDevice(p) {
		return nil, false
	}
	return d, true
}
