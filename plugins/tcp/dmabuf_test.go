package tcp

import (
	"context"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// shareMemfd offers a 64 KiB memfd as a dma-buf over SCM_RIGHTS (the fake
// CUDA driver's kind of dma-buf); sealed, its writable shared mapping is
// refused, as a GPU dma-buf's mmap is.
func shareMemfd(t *testing.T, sealed bool) *sdk.FDShare {
	t.Helper()
	fd, err := unix.MemfdCreate("tcp-dmabuf", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 64<<10); err != nil {
		t.Fatal(err)
	}
	if sealed {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != nil {
			t.Fatal(err)
		}
	}
	s, err := sdk.ShareDMABuf(fd, 4096, 32<<10, "fake-gpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestDMABufRegistersWhenMappable: the plugin process declares the dmabuf
// memory kind and registers a dma-buf the CPU can map (grants on it work);
// one whose mmap fails is FailedPrecondition saying why, and the plugin
// stays up and registers the next one.
func TestDMABufRegistersWhenMappable(t *testing.T) {
	ctx := context.Background()
	pl, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	tr := pl.Transport()
	info, err := tr.Info(ctx)
	if err != nil || !slices.Contains(info.Capabilities.MemoryKinds, sdk.MemoryDMABuf) {
		t.Fatalf("memory kinds %v (%v): want dmabuf declared", info.Capabilities.MemoryKinds, err)
	}
	_, err = tr.RegisterMemory(ctx, shareMemfd(t, true).Desc())
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cannot be mapped") {
		t.Fatalf("unmappable dma-buf: %v, want FailedPrecondition saying it cannot be mapped", err)
	}
	id, err := tr.RegisterMemory(ctx, shareMemfd(t, false).Desc())
	if err != nil {
		t.Fatalf("mappable dma-buf: %v", err)
	}
	g := tr.(sdk.Granter)
	if _, err := g.Grant(ctx, sdk.Window{Region: id, Offset: 4096, Length: 8192}); err != nil {
		t.Fatalf("grant on the dma-buf region: %v", err)
	}
	if err := tr.DeregisterMemory(ctx, id); err != nil {
		t.Fatal(err)
	}
}
