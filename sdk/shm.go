package sdk

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/errdefs"
)

// How memory gets from host to plugin without a copy: the host creates a
// memfd (anonymous shared memory) and keeps the descriptor open; the
// MemoryDesc it sends names /proc/<host pid>/fd/<fd>. Opening that path in
// the plugin reopens the same memfd (it is a magic link, not a copy), and
// both processes map it MAP_SHARED, so bytes a plugin receives into its
// mapping are in the engine's buffer. This needs the plugin to run as the
// same user as the host (the kernel checks ptrace-read access to /proc/<pid>/fd),
// which is always the case for go-plugin children. We chose it over passing
// descriptors with SCM_RIGHTS because go-plugin gives us no side channel for
// that after start, and the path works unchanged in-process (sdktest).

// SharedMemory is host memory that a plugin can map: a memfd mapped
// MAP_SHARED into the host. Keep it open while any plugin has it registered.
type SharedMemory struct {
	mu   sync.Mutex
	fd   int
	mem  []byte
	name string
}

// NewSharedMemory creates size bytes of shared memory, zero-filled.
func NewSharedMemory(name string, size uint64) (*SharedMemory, error) {
	if size == 0 {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "shared memory %q: zero size", name)
	}
	fd, err := unix.MemfdCreate("kvfence-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ResourceExhausted, "memfd_create: %v", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, errdefs.Errorf(errdefs.ResourceExhausted, "ftruncate memfd to %d: %v", size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, errdefs.Errorf(errdefs.ResourceExhausted, "mmap memfd: %v", err)
	}
	return &SharedMemory{fd: fd, mem: mem, name: name}, nil
}

// Bytes is the host's view of the memory.
func (s *SharedMemory) Bytes() []byte { return s.mem }

// Desc describes the memory for RegisterMemory.
func (s *SharedMemory) Desc() MemoryDesc {
	return MemoryDesc{
		Kind: MemoryHostShared,
		Path: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), s.fd),
		Size: uint64(len(s.mem)),
	}
}

// Close unmaps and closes the memory. Deregister it from every plugin first:
// a plugin's own mapping stays valid, but new registrations fail.
func (s *SharedMemory) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem = nil
	if cerr := unix.Close(s.fd); err == nil {
		err = cerr
	}
	return err
}

// Mapping is a plugin's view of host shared memory.
type Mapping struct {
	mu   sync.Mutex
	full []byte // the whole page-aligned mapping (what munmap needs)
	view []byte // the described region within it
}

// MapMemory maps host-shared memory described by desc into this process
// (MAP_SHARED, read-write). Plugins call it from RegisterMemory.
func MapMemory(desc MemoryDesc) (*Mapping, error) {
	if desc.Kind != MemoryHostShared {
		return nil, errdefs.Errorf(errdefs.Unimplemented, "MapMemory: %v memory is not CPU-mappable", desc.Kind)
	}
	if desc.Size == 0 {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "MapMemory: zero size")
	}
	if desc.Path == "" {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "MapMemory: empty path")
	}
	f, err := os.OpenFile(desc.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.NotFound, "MapMemory: open %s: %v", desc.Path, err)
	}
	defer f.Close() // the mapping outlives the descriptor
	st, err := f.Stat()
	if err != nil {
		return nil, errdefs.Errorf(errdefs.Internal, "MapMemory: stat: %v", err)
	}
	if desc.Offset+desc.Size < desc.Offset || uint64(st.Size()) < desc.Offset+desc.Size {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "MapMemory: [%d,+%d) beyond file size %d", desc.Offset, desc.Size, st.Size())
	}
	m, err := mapRange(f, desc)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ResourceExhausted, "MapMemory: mmap: %v", err)
	}
	return m, nil
}

// MapDMABuf maps a dma-buf described by desc into this process
// (MAP_SHARED, read-write), for a transport that moves bytes with the CPU
// (the TCP reference plugin). It works only where the exporter lets the
// CPU map the buffer: udmabuf, or the fake CUDA driver's memfd. A real
// GPU's dma-buf usually refuses mmap: that is FailedPrecondition, with
// the reason, and nothing is kept. The imported file is closed once
// mapped: the mapping holds the buffer for as long as it lasts.
func MapDMABuf(desc MemoryDesc) (*Mapping, error) {
	if desc.Kind != MemoryDMABuf {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "MapDMABuf: %v is not a dma-buf", desc.Kind)
	}
	if desc.Size == 0 {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "MapDMABuf: zero size")
	}
	f, err := ImportDMABuf(desc)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd) // a dma-buf's size (fstat may say 0)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.FailedPrecondition, "MapDMABuf: size of the dma-buf: %v", err)
	}
	if desc.Offset+desc.Size < desc.Offset || uint64(end) < desc.Offset+desc.Size {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "MapDMABuf: [%d,+%d) beyond the dma-buf's %d bytes", desc.Offset, desc.Size, end)
	}
	m, err := mapRange(f, desc)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.FailedPrecondition,
			"MapDMABuf: the dma-buf of %s cannot be mapped by the CPU (mmap: %v; a GPU's dma-buf usually cannot): a transport that copies with the CPU cannot write it; use staged mode or an RDMA transport", desc.Device, err)
	}
	return m, nil
}

// mapRange maps desc's range of f shared and read-write, from the host
// page it starts in (mmap wants an aligned offset).
func mapRange(f *os.File, desc MemoryDesc) (*Mapping, error) {
	page := uint64(os.Getpagesize())
	base := desc.Offset &^ (page - 1)
	skip := desc.Offset - base
	full, err := unix.Mmap(int(f.Fd()), int64(base), int(skip+desc.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	return &Mapping{full: full, view: full[skip : skip+desc.Size]}, nil
}

// Bytes is the mapped region.
func (m *Mapping) Bytes() []byte { return m.view }

// Close unmaps the region. The caller must ensure nothing still writes into it.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.full == nil {
		return nil
	}
	err := unix.Munmap(m.full)
	m.full, m.view = nil, nil
	return err
}

// OpenDMABuf reopens a dma-buf described by its /proc/<pid>/fd/<fd> path.
// That works only for a memfd-backed buffer (the fake driver's): the kernel
// refuses to open a real dma-buf's inode by path (ENXIO). Plugins call
// ImportDMABuf, which takes the descriptor over SCM_RIGHTS when the host
// shared it (ShareDMABuf) and falls back to this path otherwise. The SDK
// never maps a dma-buf into CPU memory.
func OpenDMABuf(desc MemoryDesc) (*os.File, error) {
	if desc.Kind != MemoryDMABuf {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "OpenDMABuf: %v is not a dma-buf", desc.Kind)
	}
	f, err := os.OpenFile(desc.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.NotFound, "OpenDMABuf: open %s: %v", desc.Path, err)
	}
	return f, nil
}

// DescribeDMABuf describes a dma-buf file descriptor that this (host) process
// holds by its /proc path; the descriptor must stay open while registered.
// Real dma-bufs need ShareDMABuf instead (see OpenDMABuf).
func DescribeDMABuf(fd int, offset, size uint64, device string) MemoryDesc {
	return MemoryDesc{
		Kind:   MemoryDMABuf,
		Path:   fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd),
		Offset: offset,
		Size:   size,
		Device: device,
	}
}
