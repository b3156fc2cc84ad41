package verbs

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/sdk"
)

// udmabuf makes a real dma-buf of size bytes from a sealed memfd
// (/dev/udmabuf, UDMABUF_CREATE): a dma-buf exporter without a GPU. It
// returns the dma-buf fd and a CPU mapping of the memfd behind it, or
// skips when the kernel has no udmabuf.
func udmabuf(t *testing.T, size int) (int, []byte) {
	t.Helper()
	dev, err := os.OpenFile("/dev/udmabuf", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("skipped: no dma-buf exporter without a GPU here (/dev/udmabuf: %v); with a GPU, make gpu-check runs direct mode", err)
	}
	defer dev.Close()
	mfd, err := unix.MemfdCreate("kvfence-udmabuf", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := unix.Ftruncate(mfd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(mfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	// struct udmabuf_create { u32 memfd; u32 flags; u64 offset; u64 size; },
	// UDMABUF_CREATE = _IOW('u', 0x42, it); UDMABUF_FLAGS_CLOEXEC = 1.
	req := struct {
		memfd, flags uint32
		offset, size uint64
	}{uint32(mfd), 1, 0, uint64(size)}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, dev.Fd(), 0x40187542, uintptr(unsafe.Pointer(&req)))
	if errno != 0 {
		t.Fatalf("UDMABUF_CREATE: %v", errno)
	}
	t.Cleanup(func() { unix.Close(int(fd)) })
	return int(fd), mem
}

// TestDeviceDMABufWrite is direct mode's data path on an RDMA device: a
// real dma-buf reaches the receiving transport over SCM_RIGHTS
// (sdk.ShareDMABuf / ImportDMABuf), is registered with ibv_reg_dmabuf_mr,
// and an RDMA WRITE through a key granted on it lands in the buffer at the
// granted offset, and nowhere else. It skips, saying why, without a device,
// without a dma-buf exporter, or on a device whose driver cannot register
// a dma-buf (Soft-RoCE, rxe, has no dma-buf registration in mainline Linux
// as far as we know: it copies with the CPU, which a device buffer does
// not allow).
func TestDeviceDMABufWrite(t *testing.T) {
	s, r := deviceConfigs(t, RevokeAuto)
	const size = 1 << 20
	fd, mem := udmabuf(t, size)
	e, _, rt := newEnv(t, s, r)
	share, err := sdk.ShareDMABuf(fd, 0, size, "udmabuf")
	if err != nil {
		t.Fatal(err)
	}
	defer share.Close()
	ctx := context.Background()
	id, err := rt.RegisterMemory(ctx, share.Desc())
	if err != nil && strings.Contains(err.Error(), "not supported") {
		t.Skipf("skipped: device %q cannot register a dma-buf: %v", r.Device, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.DeregisterMemory(ctx, id) }()
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: id, Offset: 64 << 10, Length: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	fill(e.Src.Bytes()[:32<<10], 0x5a)
	b := e.NewBatchID()
	if err := e.Pair.Sender.Post(ctx, e.Write(b, k, 0, 4096, 32<<10)); err != nil {
		t.Fatal(err)
	}
	if c, err := e.Wait(b); err != nil || c.Status != sdk.Succeeded {
		t.Fatalf("write into the dma-buf: %+v %v", c, err)
	}
	at := 64<<10 + 4096
	if !bytes.Equal(mem[at:at+32<<10], e.Src.Bytes()[:32<<10]) {
		t.Fatal("the write did not land in the dma-buf at the granted offset")
	}
	if err := noByte(mem[:at], 0); err != nil {
		t.Fatalf("before the window: %v", err)
	}
	if err := noByte(mem[at+32<<10:], 0); err != nil {
		t.Fatalf("after the write: %v", err)
	}
}
