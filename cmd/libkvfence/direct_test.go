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
	return openDirectWith(t, fmt.Sprintf(`"direct_buffer": %d, "direct_pages": %d`, buf, pages)), buf
}

// openDirectWith opens decode rank 0 in direct mode on the TCP plugin with
// the engine buffers engine names (config keys), 4 pages lent at once.
func openDirectWith(t *testing.T, engine string) (dec uint64) {
	t.Helper()
	cfg := fmt.Sprintf(`{"slots": 4, "shard_bytes": 4096, "gpu_mode": "direct", %s, "max_hold_ms": 600000, "plugin": %q, "log_level": "off"}`,
		engine, pluginBin)
	var e errBuf
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&dec), e.p()); rc != 0 {
		t.Fatalf("decode_open in direct mode: %d %s", rc, e.Message[:])
	}
	t.Cleanup(func() { abi(kvfence_close, dec, nil) })
	return dec
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
	src := sendPagesT(t, pre, rv, 31, 2)
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

// sendPagesT sends n pages of a pattern from prefill for request room and
// waits for decode's receiver rv to say SUCCESS; it returns the bytes.
func sendPagesT(t *testing.T, pre, rv, room uint64, n int) []byte {
	t.Helper()
	var e errBuf
	var sd uint64
	if rc := abi(kvfence_sender_new, pre, room, 1, unsafe.Pointer(&sd), e.p()); rc != 0 {
		t.Fatalf("sender_new: %d", rc)
	}
	t.Cleanup(func() { abi(kvfence_close, sd, nil) })
	src := make([]byte, n*4096)
	for i := range src {
		src[i] = byte(i*7 + i/4096 + int(room))
	}
	if rc := abi(kvfence_sender_init, sd, n, e.p()); rc != 0 {
		t.Fatalf("sender_init: %d", rc)
	}
	if rc := abi(kvfence_sender_write, sd, 0, n, unsafe.Pointer(&src[0]), len(src), e.p()); rc != 0 {
		t.Fatalf("sender_write: %d %s", rc, e.Message[:])
	}
	abi(kvfence_sender_send, sd, n, e.p())
	abi(kvfence_sender_finish, sd, n, e.p())
	if st := abi(kvfence_wait, rv, 60_000); st != 4 {
		t.Fatalf("receiver state %d, want SUCCESS", st)
	}
	return src
}

// TestDirectSplitBuffersThroughTheABI: direct_buffers, the engine's KV as
// one buffer per layer (three, of uneven page pieces: direct_page_bytes),
// exported at decode open; a request's page lands piece by piece in every
// buffer at the engine page kvfence_receiver_init_at named (read back
// through the driver), and no other page of any buffer is written.
func TestDirectSplitBuffersThroughTheABI(t *testing.T) {
	d := fakeDevice(t)
	pieces := []int{1024, 2048, 1024}
	var bufs []uintptr
	for _, pb := range pieces {
		bufs = append(bufs, devBufs(t, d, 1, 16, pb, nil)[0])
	}
	dec := openDirectWith(t, fmt.Sprintf(`"direct_buffers": [%d, %d, %d], "direct_page_bytes": [1024, 2048, 1024], "direct_pages": 16`, bufs[0], bufs[1], bufs[2]))
	pre := openPrefillT(t, dec)
	rv := newReceiverT(t, dec, 41)
	defer abi(kvfence_close, rv, nil)
	if rc, msg := initAt(rv, 11, 3); rc != 0 {
		t.Fatalf("receiver_init_at: %d %s", rc, msg)
	}
	src := sendPagesT(t, pre, rv, 41, 2)
	lent := map[int]int{11: 0, 3: 1}
	lo := 0
	for b, pb := range pieces {
		for p := range 16 {
			got, want := make([]byte, pb), make([]byte, pb)
			if i, ok := lent[p]; ok {
				want = src[i*4096+lo : i*4096+lo+pb]
			}
			if err := d.CopyFromDevice(got, bufs[b]+uintptr(p*pb)); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("buffer %d, engine page %d (lent %v): not the request's piece (%v)", b, p, lent, err)
			}
		}
		lo += pb
	}
	var e errBuf
	abi(kvfence_receiver_finish, rv, e.p())
	for abi(kvfence_receiver_released, rv) != 1 {
		time.Sleep(10 * time.Millisecond) // the release comes on its own; the test's timeout bounds it
	}
}

// TestDirectAbortAfterSuccessThroughTheABI: in direct mode an engine that
// aborts a request which already succeeded (dropping a finished request)
// gets the engine pages back — kvfence_receiver_released turns 1 and the
// pages can be lent again — without calling kvfence_receiver_finish.
// max_hold_ms is 10 minutes: no timeout ends the exposure in the test's
// time; only the abort can.
func TestDirectAbortAfterSuccessThroughTheABI(t *testing.T) {
	d := fakeDevice(t)
	dec, _ := openDirectDecodeT(t, d, 16)
	pre := openPrefillT(t, dec)
	rv := newReceiverT(t, dec, 51)
	defer abi(kvfence_close, rv, nil)
	if rc, msg := initAt(rv, 7, 8); rc != 0 {
		t.Fatalf("receiver_init_at: %d %s", rc, msg)
	}
	sendPagesT(t, pre, rv, 51, 2)
	if abi(kvfence_receiver_released, rv) != 0 {
		t.Fatal("engine pages released before the engine let them go")
	}
	var e errBuf
	if rc := abi(kvfence_receiver_abort, rv, e.p()); rc != 0 {
		t.Fatalf("receiver_abort after success: %d %s", rc, e.Message[:])
	}
	for deadline := time.Now().Add(30 * time.Second); abi(kvfence_receiver_released, rv) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) { // one step: a loaded machine releases in far less
			t.Fatal("engine pages still lent 30 s after an abort that came after success")
		}
	}
	other := newReceiverT(t, dec, 52)
	defer abi(kvfence_close, other, nil)
	if rc, msg := initAt(other, 8, 7); rc != 0 {
		t.Fatalf("engine pages 8 and 7 after the abort: %d %s", rc, msg)
	}
}
