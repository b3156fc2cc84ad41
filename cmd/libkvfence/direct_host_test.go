package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestDirectHostPagesThroughTheABI: direct_host_pages adds host landing
// pages past direct_pages: a request's KV pages land in the engine's
// buffer, its extra page (an aux row) in landing page 16 — read back with
// kvfence_receiver_read, which refuses the engine pages; a landing page
// still lent is refused FAILED_PRECONDITION until the release; an index
// past the landing pages is INVALID_ARGUMENT; a negative count is refused
// at open.
func TestDirectHostPagesThroughTheABI(t *testing.T) {
	d := fakeDevice(t)
	buf := devBufs(t, d, 1, 16, 4096, nil)[0]
	dec := openDirectWith(t, fmt.Sprintf(`"direct_buffer": %d, "direct_pages": 16, "direct_host_pages": 2`, buf))
	pre := openPrefillT(t, dec)
	var e errBuf
	rv := newReceiverT(t, dec, 41)
	defer abi(kvfence_close, rv, nil)
	if rc, msg := initAt(rv, 9, 17); rc != 0 {
		t.Fatalf("receiver_init_at over an engine page and a landing page: %d %s", rc, msg)
	}
	other := newReceiverT(t, dec, 42)
	defer abi(kvfence_close, other, nil)
	if rc, msg := initAt(other, 3, 17); rc != codeFailedPrecondition {
		t.Fatalf("landing page 17 still lent: %d %s, want FAILED_PRECONDITION", rc, msg)
	}
	if rc, msg := initAt(other, 18); rc != codeInvalid {
		t.Fatalf("index 18 of 16 + 2: %d %s, want INVALID_ARGUMENT", rc, msg)
	}
	src := sendPagesT(t, pre, rv, 41, 2)
	got := make([]byte, 4096)
	if err := d.CopyFromDevice(got, buf+9*4096); err != nil || !bytes.Equal(got, src[:4096]) {
		t.Fatalf("engine page 9 does not hold the request's page 0 (%v)", err)
	}
	if rc := abi(kvfence_receiver_read, rv, 1, 1, unsafe.Pointer(&got[0]), len(got), e.p()); rc != 0 || !bytes.Equal(got, src[4096:]) {
		t.Fatalf("receiver_read of landing page 17: %d %s (equal %v)", rc, e.Message[:], bytes.Equal(got, src[4096:]))
	}
	if rc := abi(kvfence_receiver_read, rv, 0, 2, unsafe.Pointer(&make([]byte, 8192)[0]), 8192, e.p()); rc != codeFailedPrecondition {
		t.Fatalf("receiver_read over an engine page: %d, want FAILED_PRECONDITION", rc)
	}
	abi(kvfence_receiver_finish, rv, e.p())
	for abi(kvfence_receiver_released, rv) != 1 {
		time.Sleep(10 * time.Millisecond) // the release comes on its own; the test's timeout bounds it
	}
	if rc, msg := initAt(other, 3, 17); rc != 0 {
		t.Fatalf("landing page 17 after the release: %d %s", rc, msg)
	}
	cfg := fmt.Sprintf(`{"slots": 4, "shard_bytes": 4096, "gpu_mode": "direct", "direct_buffer": %d, "direct_pages": 16, "direct_host_pages": -1, "plugin": %q, "log_level": "off"}`, buf, pluginBin)
	var bad uint64
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&bad), e.p()); rc != codeInvalid {
		t.Fatalf("direct_host_pages -1: %d, want INVALID_ARGUMENT", rc)
	}
}

// landingMaps counts this process's mappings of decode rank 0's host
// landing pages (the memfd the agent names decode-0-landing).
func landingMaps(t *testing.T) int {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(maps), "kvfence-decode-0-landing")
}

// TestDirectHostPagesUnmappedAtClose: kvfence_close of a direct-mode
// decode agent unmaps its host landing pages — after its plugin process
// is closed, so also with a request still held over one of them (aborted,
// its writer never drained: the hold outlives the agent).
func TestDirectHostPagesUnmappedAtClose(t *testing.T) {
	d := fakeDevice(t)
	buf := devBufs(t, d, 1, 16, 4096, nil)[0]
	before := landingMaps(t)
	dec := openDirectWith(t, fmt.Sprintf(`"direct_buffer": %d, "direct_pages": 16, "direct_host_pages": 2`, buf))
	if landingMaps(t) == before {
		t.Fatal("no mapping of the host landing pages found after open")
	}
	rv := newReceiverT(t, dec, 43)
	defer abi(kvfence_close, rv, nil)
	if rc, msg := initAt(rv, 4, 16); rc != 0 {
		t.Fatalf("receiver_init_at over an engine page and a landing page: %d %s", rc, msg)
	}
	abi(kvfence_receiver_abort, rv, nil) // held: rank 1 never linked, so it cannot drain
	if rc := abi(kvfence_close, dec, nil); rc != 0 {
		t.Fatalf("kvfence_close: %d", rc)
	}
	if n := landingMaps(t); n != before {
		t.Fatalf("%d mappings of the host landing pages left after kvfence_close (before open: %d)", n, before)
	}
}
