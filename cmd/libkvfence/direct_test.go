package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/gpumem"
)

const codeFailedPrecondition = 6

// openDirectDecodeT opens decode rank 0 in direct mode on the TCP plugin
// over a fake-GPU buffer of pages pages of 4 KiB, 4 of them lent at once.
func openDirectDecodeT(t *testing.T, d *gpumem.Device, pages int) (dec uint64, buf uintptr) {
	t.Helper()
	buf = devBufs(t, d, 1, pages, 4096, nil)[0]
	cfg := fmt.Sprintf(`{"slots": 4, "shard_bytes": 4096, "gpu_mode": "direct", "direct_buffer": %d, "direct_pages": %d, "plugin": %q, "log_level": "off"}`,
		buf, pages, pluginBin)
	var e errBuf
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&dec), e.p()); rc != 0 {
		t.Fatalf("decode_open in direct mode: %d %s", rc, e.Message[:])
	}
	t.Cleanup(func() { abi(kvfence_close, dec, nil) })
	return dec, buf
}

func initAt(rv uint64, idx ...int32) (int64, string) {
	ranks := []uint32{1}
	var e errBuf
	rc := abi(kvfence_receiver_init_at, rv, unsafe.Pointer(&idx[0]), len(idx), unsafe.Pointer(&ranks[0]), 1, e.p())
	return rc, string(bytes.TrimRight(e.Message[:], "\x00"))
}

// TestDirectModeThroughTheABI: gpu_mode "direct" through the C ABI with
// the fake CUDA driver and real TCP plugin processes: the decode engine's
// buffer is exported as a dma-buf at open, a request's pages land in the
// engine pages kvfence_receiver_init_at named (read back through the
// driver), a page still lent is refused FAILED_PRECONDITION until the
// request is released, the pool-picked init and the pool reads are
// refused.
func TestDirectModeThroughTheABI(t *testing.T) {
	d := fakeDevice(t)
	dec, buf := openDirectDecodeT(t, d, 16)
	pre := openPrefillT(t, dec)
	var e errBuf
	rv := newReceiverT(t, dec, 31)
	defer abi(kvfence_close, rv, nil)
	if rc, msg := initAt(rv, 9, 2); rc != 0 {
		t.Fatalf("receiver_init_at: %d %s", rc, msg)
	}
	other := newReceiverT(t, dec, 32)
	defer abi(kvfence_close, other, nil)
	if rc, msg := initAt(other, 5, 2); rc != codeFailedPrecondition {
		t.Fatalf("engine page 2 still lent: %d %s, want FAILED_PRECONDITION", rc, msg)
	}
	if rc, msg := initAt(other, 16); rc != codeInvalid {
		t.Fatalf("engine page 16 of 16: %d %s, want INVALID_ARGUMENT", rc, msg)
	}
	ranks := []uint32{1}
	if rc := abi(kvfence_receiver_init, other, 1, unsafe.Pointer(&ranks[0]), 1, e.p()); rc != codeFailedPrecondition {
		t.Fatalf("pool-picked init in direct mode: %d, want FAILED_PRECONDITION", rc)
	}
	var sd uint64
	if rc := abi(kvfence_sender_new, pre, 31, 1, unsafe.Pointer(&sd), e.p()); rc != 0 {
		t.Fatalf("sender_new: %d", rc)
	}
	defer abi(kvfence_close, sd, nil)
	src := make([]byte, 2*4096)
	for i := range src {
		src[i] = byte(i*7 + i/4096)
	}
	if rc := abi(kvfence_sender_init, sd, 2, e.p()); rc != 0 {
		t.Fatalf("sender_init: %d", rc)
	}
	if rc := abi(kvfence_sender_write, sd, 0, 2, unsafe.Pointer(&src[0]), len(src), e.p()); rc != 0 {
		t.Fatalf("sender_write: %d %s", rc, e.Message[:])
	}
	abi(kvfence_sender_send, sd, 2, e.p())
	abi(kvfence_sender_finish, sd, 2, e.p())
	if st := abi(kvfence_wait, rv, 60_000); st != 4 {
		t.Fatalf("receiver state %d, want SUCCESS", st)
	}
	for i, p := range []int{9, 2} {
		got := make([]byte, 4096)
		if err := d.CopyFromDevice(got, buf+uintptr(p*4096)); err != nil || !bytes.Equal(got, src[i*4096:(i+1)*4096]) {
			t.Fatalf("engine page %d does not hold the request's page %d (%v)", p, i, err)
		}
	}
	dst := make([]byte, 4096)
	if rc := abi(kvfence_receiver_read, rv, 0, 1, unsafe.Pointer(&dst[0]), len(dst), e.p()); rc != codeFailedPrecondition {
		t.Fatalf("receiver_read in direct mode: %d, want FAILED_PRECONDITION", rc)
	}
	abi(kvfence_receiver_finish, rv, e.p())
	for abi(kvfence_receiver_released, rv) != 1 {
		time.Sleep(10 * time.Millisecond) // the release comes on its own; the test's timeout bounds it
	}
	if rc, msg := initAt(other, 5, 2); rc != 0 {
		t.Fatalf("engine page 2 after the release: %d %s", rc, msg)
	}
}
