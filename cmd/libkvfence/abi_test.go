package main

// The C ABI's refusals, tested from Go by calling the exported functions
// themselves. Test files cannot use cgo, so the helpers below build each
// argument with reflect from the function's own parameter types: the calls
// are exactly the ones C makes, minus the crossing.

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

var pluginBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvfence-libtest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = os.Unsetenv("KVFENCE_PLUGIN") // a config must name its plugin (FuzzABI relies on it)
	code := 1
	if pluginBin, err = sdktest.BuildPlugin(dir, "github.com/kvfence/kvfence/plugins/tcp/cmd/kvfence-plugin-tcp"); err != nil {
		fmt.Fprintln(os.Stderr, "build plugin:", err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// cmem is memory outside Go's heap, as C callers hand us: a read-write
// region followed by a PROT_NONE guard page, and an address range that was
// mapped and is no longer.
type cmem struct {
	rw       []byte
	guard    unsafe.Pointer
	unmapped unsafe.Pointer
}

const cmemBytes = 1 << 20

var (
	cmemOnce sync.Once
	theCmem  cmem
)

// unmappedAddress returns an address no mapping can ever fill. The tests
// write through it (an out parameter, an error struct), so an address that
// another thread's mmap may take between the test's choice and its use
// would let them scribble on that mapping: a hole the test had mapped and
// unmapped was once filled so. Under 4-level paging the last page below
// 2^47 lies outside the user address space (mmap there fails ENOMEM); where
// it does not (5-level paging), the address is a one-page hole between two
// PROT_NONE pages the test keeps, which only a one-page mmap could fill.
func unmappedAddress(t testing.TB) unsafe.Pointer {
	const page = 4096
	const fixedNoReplace = 0x100000 // MAP_FIXED_NOREPLACE
	const beyondUser = 1<<47 - page
	addr, _, errno := syscall.Syscall6(syscall.SYS_MMAP, beyondUser, page, syscall.PROT_NONE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE|fixedNoReplace, ^uintptr(0), 0)
	if errno == syscall.ENOMEM {
		return unsafe.Add(unsafe.Pointer(nil), uintptr(beyondUser))
	}
	if errno == 0 {
		_, _, _ = syscall.Syscall(syscall.SYS_MUNMAP, addr, page, 0)
	}
	addr, _, errno = syscall.Syscall6(syscall.SYS_MMAP, 0, 3*page, syscall.PROT_NONE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE, ^uintptr(0), 0)
	if errno != 0 {
		t.Fatalf("mmap: %v", errno)
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_MUNMAP, addr+page, page, 0); errno != 0 {
		t.Fatalf("munmap: %v", errno)
	}
	return unsafe.Add(unsafe.Pointer(nil), addr+page)
}

func testMem(t testing.TB) cmem {
	cmemOnce.Do(func() {
		b, err := syscall.Mmap(-1, 0, cmemBytes+3*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			t.Fatalf("mmap: %v", err)
		}
		if err := syscall.Mprotect(b[cmemBytes:cmemBytes+4096], syscall.PROT_NONE); err != nil {
			t.Fatalf("mprotect: %v", err)
		}
		theCmem = cmem{rw: b[:cmemBytes], guard: unsafe.Pointer(&b[cmemBytes]), unmapped: unmappedAddress(t)}
	})
	return theCmem
}

// abi calls exported function fn with args converted to its parameter
// types (integers by value, unsafe.Pointer for any pointer parameter) and
// returns its result as an int64 (a double's integer part).
func abi(fn any, args ...any) int64 {
	f := reflect.ValueOf(fn)
	ft := f.Type()
	in := make([]reflect.Value, ft.NumIn())
	for i := range in {
		in[i] = abiArg(ft.In(i), args[i])
	}
	out := f.Call(in)
	if len(out) == 0 {
		return 0
	}
	switch r := out[0]; r.Kind() {
	case reflect.Float64, reflect.Float32:
		return int64(r.Float())
	case reflect.Ptr:
		return 0
	default:
		return r.Int()
	}
}

func abiArg(t reflect.Type, a any) reflect.Value {
	v := reflect.New(t).Elem()
	switch t.Kind() {
	case reflect.Ptr:
		p, _ := a.(unsafe.Pointer)
		if p != nil {
			return reflect.NewAt(t.Elem(), p)
		}
	case reflect.UnsafePointer:
		p, _ := a.(unsafe.Pointer)
		v.SetPointer(p)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(reflect.ValueOf(a).Convert(reflect.TypeFor[int64]()).Int())
	default:
		v.SetUint(reflect.ValueOf(a).Convert(reflect.TypeFor[uint64]()).Uint())
	}
	return v
}

// errBuf is a kvfence_error in Go memory.
type errBuf struct {
	Code    int32
	Message [512]byte
}

func (e *errBuf) p() unsafe.Pointer { return unsafe.Pointer(e) }

func cstr(s string) unsafe.Pointer {
	b := append([]byte(s), 0)
	return unsafe.Pointer(&b[0])
}

const (
	codeInvalid     = 2
	codeNotFound    = 3
	codeUnavailable = 5
)

// openDecodeT opens a decode rank on the TCP plugin, closed at test end.
func openDecodeT(t testing.TB, shards int) uint64 {
	t.Helper()
	var h uint64
	var e errBuf
	cfg := fmt.Sprintf(`{"slots": 8, "shard_bytes": 4096, "shards": %d, "plugin": %q, "log_level": "off"}`, shards, pluginBin)
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&h), e.p()); rc != 0 {
		t.Fatalf("decode_open: %d %s", rc, e.Message[:])
	}
	t.Cleanup(func() { abi(kvfence_close, h, nil) })
	return h
}

func newReceiverT(t testing.TB, dec uint64, room uint64) uint64 {
	t.Helper()
	var h uint64
	var e errBuf
	if rc := abi(kvfence_receiver_new, dec, room, 1, unsafe.Pointer(&h), e.p()); rc != 0 {
		t.Fatalf("receiver_new: %d", rc)
	}
	return h
}

// The crash: nranks = INT_MAX read a 4-byte array as 8 GiB.
func TestReceiverInitRefusesRankCountsBeyondShards(t *testing.T) {
	dec := openDecodeT(t, 2)
	rv := newReceiverT(t, dec, 1)
	ranks := []uint32{1, 2}
	var e errBuf
	for _, n := range []int64{math.MaxInt32, 3, 0, -1, math.MinInt32} {
		if rc := abi(kvfence_receiver_init, rv, 1, unsafe.Pointer(&ranks[0]), n, e.p()); rc != codeInvalid {
			t.Errorf("nranks %d: code %d, want INVALID_ARGUMENT", n, rc)
		}
	}
	for _, pages := range []int64{0, -1, math.MaxInt32} {
		if rc := abi(kvfence_receiver_init, rv, pages, unsafe.Pointer(&ranks[0]), 2, e.p()); rc != codeInvalid {
			t.Errorf("pages %d: code %d, want INVALID_ARGUMENT", pages, rc)
		}
	}
	m := testMem(t)
	if rc := abi(kvfence_receiver_init, rv, 1, m.guard, 2, e.p()); rc != codeInvalid {
		t.Errorf("ranks in a PROT_NONE page: code %d, want INVALID_ARGUMENT", rc)
	}
	if rc := abi(kvfence_receiver_init, rv, 1, unsafe.Pointer(&ranks[0]), 2, e.p()); rc != 0 {
		t.Errorf("a good init after the refusals: code %d (%s)", rc, e.Message[:])
	}
}

// waitReturns runs wait in a goroutine, does act, and gives wait's result
// (failing when it does not come back within a minute: it should at once).
func waitReturns(t *testing.T, h uint64, act func()) int64 {
	t.Helper()
	got := make(chan int64, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		got <- abi(kvfence_wait, h, int64(math.MaxInt64))
	}()
	<-started
	time.Sleep(50 * time.Millisecond) // let wait block (it returns either way)
	act()
	select {
	case rc := <-got:
		return rc
	case <-time.After(time.Minute):
		t.Fatal("kvfence_wait still blocked a minute after its handle closed")
		return 0
	}
}

func TestWaitReturnsWhenItsHandleCloses(t *testing.T) {
	dec := openDecodeT(t, 1)
	rv := newReceiverT(t, dec, 2)
	if rc := waitReturns(t, rv, func() { abi(kvfence_close, rv, nil) }); rc != -codeNotFound {
		t.Errorf("wait on a handle closed by another thread: %d, want -NOT_FOUND", rc)
	}
}

func TestWaitReturnsWhenItsAgentCloses(t *testing.T) {
	dec := openDecodeT(t, 1)
	rv := newReceiverT(t, dec, 3)
	defer abi(kvfence_close, rv, nil)
	if rc := waitReturns(t, rv, func() { abi(kvfence_close, dec, nil) }); rc != -codeUnavailable {
		t.Errorf("wait while its agent closes: %d, want -UNAVAILABLE", rc)
	}
}

func TestWaitTimeouts(t *testing.T) {
	dec := openDecodeT(t, 1)
	rv := newReceiverT(t, dec, 4)
	defer abi(kvfence_close, rv, nil)
	if rc := abi(kvfence_wait, rv, -1); rc != -codeInvalid {
		t.Errorf("negative timeout: %d, want -INVALID_ARGUMENT", rc)
	}
	if rc := abi(kvfence_wait, rv, 0); rc != 1 {
		t.Errorf("zero timeout on a new receiver: %d, want BOOTSTRAPPING (1)", rc)
	}
}

func TestTimingHelpersBounded(t *testing.T) {
	dec := openDecodeT(t, 1)
	rv := newReceiverT(t, dec, 5)
	defer abi(kvfence_close, rv, nil)
	for _, n := range []int64{math.MaxInt64, 1<<24 + 1, 0, -1} {
		if ns := abi(kvfence_poll_go_ns, rv, n); ns != -codeInvalid {
			t.Errorf("poll_go_ns(%d): %d, want -INVALID_ARGUMENT", n, ns)
		}
		if ns := abi(kvfence_page_bytes_go_ns, dec, n); ns != -codeInvalid {
			t.Errorf("page_bytes_go_ns(%d): %d, want -INVALID_ARGUMENT", n, ns)
		}
	}
	// The largest count stops after about a second of polls: it returns
	// (a wait on the event, no time budget asserted).
	if ns := abi(kvfence_poll_go_ns, rv, 1<<24); ns < 0 {
		t.Errorf("poll_go_ns(2^24): %d", ns)
	}
}

// Pointers C may pass: NULL, a PROT_NONE page, an address no longer
// mapped, one straddling into the guard page, a non-canonical one.
func badPointers(m cmem) map[string]unsafe.Pointer {
	return map[string]unsafe.Pointer{
		"NULL":          nil,
		"PROT_NONE":     m.guard,
		"unmapped":      m.unmapped,
		"straddling":    unsafe.Add(m.guard, -4),
		"non-canonical": unsafe.Add(unsafe.Add(unsafe.Pointer(nil), math.MaxInt64), 1),
		// Not 1..4095 (say &((T*)NULL)->field): a Go frame holding such a
		// pointer aborts the process when its stack moves (the runtime's
		// invalidptr check), the one refusal abi.h cannot promise.
	}
}

func TestFaultingPointersAreInvalidArguments(t *testing.T) {
	dec := openDecodeT(t, 1)
	m := testMem(t)
	var e errBuf
	for name, p := range badPointers(m) {
		if rc := abi(kvfence_decode_open, p, unsafe.Pointer(&m.rw[0]), e.p()); rc != codeInvalid {
			t.Errorf("decode_open config %s: %d", name, rc)
		}
		if rc := abi(kvfence_receiver_new, dec, 9, 1, p, e.p()); rc != codeInvalid {
			t.Errorf("receiver_new out %s: %d", name, rc)
		}
		if name != "NULL" { // NULL buf is a size query (RESOURCE_EXHAUSTED)
			if rc := abi(kvfence_agent_stats, dec, p, 4096, nil, e.p()); rc != codeInvalid {
				t.Errorf("agent_stats buf %s: %d", name, rc)
			}
			if rc := abi(kvfence_agent_metrics, dec, unsafe.Pointer(&m.rw[0]), 1<<16, p, e.p()); rc != codeInvalid {
				t.Errorf("agent_metrics needed %s: %d", name, rc)
			}
		}
		if rc := abi(kvfence_agent_addr, dec, unsafe.Pointer(&m.rw[0]), 64, p); rc != 0 {
			t.Errorf("agent_addr with error struct %s: %d (the call itself is good)", name, rc)
		}
	}
	cfg := []byte(`{"slots": 1}`) // no NUL before the guard page
	copy(m.rw[cmemBytes-len(cfg):], cfg)
	if rc := abi(kvfence_decode_open, unsafe.Pointer(&m.rw[cmemBytes-len(cfg)]), unsafe.Pointer(&m.rw[0]), e.p()); rc != codeInvalid {
		t.Errorf("config without NUL up to a guard page: %d", rc)
	}
	if rc := abi(kvfence_agent_addr, dec, unsafe.Pointer(&m.rw[0]), uint64(math.MaxUint64), e.p()); rc != 0 {
		t.Errorf("agent_addr with size 2^64-1 over a big enough buffer: %d", rc)
	}
}

func TestConfigBounds(t *testing.T) {
	var h uint64
	var e errBuf
	for _, cfg := range []string{
		`{"slots": 2147483647, "shard_bytes": 4096}`,
		`{"slots": 4, "shard_bytes": 9223372036854775807}`,
		`{"slots": 1048576, "shard_bytes": 17179869184, "shards": 64}`,
		`{"slots": 4, "shard_bytes": 64, "shards": 65}`,
		`{"slots": 4, "shard_bytes": 64, "lease_ms": 9223372036854775807}`,
		`{"slots": 4, "shard_bytes": 64, "max_hold_ms": -5}`,
	} {
		if rc := abi(kvfence_decode_open, cstr(withPlugin(cfg)), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
			t.Errorf("decode %s: %d", cfg, rc)
			abi(kvfence_close, h, nil)
		}
	}
	for _, cfg := range []string{
		`{"decode_addr": "x:1", "source_pages": 4, "shard_bytes": 64, "lanes": 100000000}`,
		`{"decode_addr": "x:1", "source_pages": 2147483647, "shard_bytes": 1099511627776}`,
		`{"decode_addr": "x:1", "source_pages": 4, "shard_bytes": 64, "heartbeat_ms": -1}`,
	} {
		if rc := abi(kvfence_prefill_open, cstr(withPlugin(cfg)), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
			t.Errorf("prefill %s: %d", cfg, rc)
			abi(kvfence_close, h, nil)
		}
	}
}

// withPlugin adds the plugin to a config, so that only its bounds can
// refuse it.
func withPlugin(cfg string) string {
	return fmt.Sprintf(`{"plugin": %q, "log_level": "off", `, pluginBin) + cfg[1:]
}

// sockDir keeps go-plugin's unix sockets under a short path.
func init() {
	if len(os.TempDir()) > 40 {
		_ = os.Setenv("TMPDIR", filepath.Clean("/tmp"))
	}
}

// openPairT opens a decode rank (one shard) and a prefill rank 1 linked
// to it, both closed at test end.
func openPairT(t *testing.T) (dec, pre uint64) {
	t.Helper()
	dec = openDecodeT(t, 1)
	return dec, openPrefillT(t, dec)
}

// openPrefillT opens prefill rank 1 linked to decode rank dec.
func openPrefillT(t *testing.T, dec uint64) (pre uint64) {
	t.Helper()
	addr := make([]byte, 128)
	abi(kvfence_agent_addr, dec, unsafe.Pointer(&addr[0]), len(addr), nil)
	cfg := fmt.Sprintf(`{"rank": 1, "source_pages": 8, "shard_bytes": 4096, "log_level": "off", "plugin": %q, "decode_addr": %q}`,
		pluginBin, string(addr[:strings.IndexByte(string(addr), 0)]))
	var e errBuf
	if rc := abi(kvfence_prefill_open, cstr(cfg), unsafe.Pointer(&pre), e.p()); rc != 0 {
		t.Fatalf("prefill_open: %d %s", rc, e.Message[:])
	}
	t.Cleanup(func() { abi(kvfence_close, pre, nil) })
	for abi(kvfence_prefill_linked, pre) != 1 || abi(kvfence_decode_linked, dec, 1) != 1 {
		time.Sleep(10 * time.Millisecond) // the link comes up on its own; the test's timeout bounds it
	}
	return pre
}

// The Python crash at its root: src and dst that fault, where a
// page is really copied (a handed-off request).
func TestWriteAndReadFaultingMemoryAreInvalidArguments(t *testing.T) {
	dec, pre := openPairT(t)
	m := testMem(t)
	var e errBuf
	rv := newReceiverT(t, dec, 21)
	defer abi(kvfence_close, rv, nil)
	ranks := []uint32{1}
	if rc := abi(kvfence_receiver_init, rv, 1, unsafe.Pointer(&ranks[0]), 1, e.p()); rc != 0 {
		t.Fatalf("receiver_init: %d", rc)
	}
	var sd uint64
	if rc := abi(kvfence_sender_new, pre, 21, 1, unsafe.Pointer(&sd), e.p()); rc != 0 {
		t.Fatalf("sender_new: %d", rc)
	}
	defer abi(kvfence_close, sd, nil)
	if rc := abi(kvfence_sender_init, sd, 1, e.p()); rc != 0 {
		t.Fatalf("sender_init: %d", rc)
	}
	for name, p := range badPointers(m) {
		if rc := abi(kvfence_sender_write, sd, 0, 1, p, 4096, e.p()); rc != codeInvalid {
			t.Errorf("sender_write from %s: %d", name, rc)
		}
	}
	src := m.rw[:4096]
	for i := range src {
		src[i] = byte(i * 7)
	}
	if rc := abi(kvfence_sender_write, sd, 0, 1, unsafe.Pointer(&src[0]), 4096, e.p()); rc != 0 {
		t.Fatalf("sender_write: %d", rc)
	}
	abi(kvfence_sender_send, sd, 1, e.p())
	abi(kvfence_sender_finish, sd, 1, e.p())
	if st := abi(kvfence_wait, rv, 60_000); st != 4 {
		t.Fatalf("receiver state %d, want SUCCESS", st)
	}
	for name, p := range badPointers(m) {
		if rc := abi(kvfence_receiver_read, rv, 0, 1, p, 4096, e.p()); rc != codeInvalid {
			t.Errorf("receiver_read into %s: %d", name, rc)
		}
	}
	dst := m.rw[8192 : 8192+4096]
	if rc := abi(kvfence_receiver_read, rv, 0, 1, unsafe.Pointer(&dst[0]), 4096, e.p()); rc != 0 || !bytes.Equal(dst, src) {
		t.Errorf("a good read after the refusals: code %d, bytes equal %v", rc, bytes.Equal(dst, src))
	}
	abi(kvfence_receiver_finish, rv, e.p())
}

// TestGPUModeDirectRefusedAtOpen: gpu_mode "direct" on decode without the
// engine's buffer (direct_buffer, direct_pages) is INVALID_ARGUMENT, and
// so is a buffer in staged mode or a mistyped mode; "staged" opens.
func TestGPUModeDirectRefusedAtOpen(t *testing.T) {
	for _, c := range []struct {
		mode, extra, want string
		code              int64
	}{
		{"direct", "", "direct_buffer", codeInvalid},
		{"staged", `, "direct_buffer": 4096, "direct_pages": 2`, "need gpu_mode", codeInvalid},
		{"staged", `, "direct_buffers": [4096]`, "need gpu_mode", codeInvalid},
		{"direct", `, "direct_buffer": 4096, "direct_buffers": [8192], "direct_pages": 2`, "both set", codeInvalid},
		{"direct", `, "direct_buffer": 4096, "direct_page_bytes": [4096], "direct_pages": 2`, "goes with direct_buffers", codeInvalid},
		{"direct", `, "direct_buffers": [4096, 8192], "direct_page_bytes": [1024, 1024], "direct_pages": 2`, "add up to 2048", codeInvalid},
		{"direct", `, "direct_buffers": [4096, 8192], "direct_page_bytes": [4096], "direct_pages": 2`, "1 direct_page_bytes for 2", codeInvalid},
		{"direct", `, "direct_buffers": [4096, 8192, 12288], "direct_pages": 2`, "split evenly", codeInvalid},
		{"direct", `, "direct_buffers": [], "direct_pages": 2`, "1..4096 buffers", codeInvalid},
		{"dirct", "", "gpu_mode", codeInvalid},
		{"staged", "", "", 0},
	} {
		var h uint64
		var e errBuf
		cfg := withPlugin(fmt.Sprintf(`{"slots": 8, "shard_bytes": 4096, "gpu_mode": %q%s}`, c.mode, c.extra))
		rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&h), e.p())
		if rc == 0 {
			abi(kvfence_close, h, nil)
		}
		if rc != c.code || !strings.Contains(string(e.Message[:]), c.want) {
			t.Errorf("gpu_mode %q%s: %d %s; want %d naming %q", c.mode, c.extra, rc, e.Message[:], c.code, c.want)
		}
	}
}

// dmabufTransport declares the dmabuf memory kind, as verbs does.
type dmabufTransport struct{ sdk.Transport }

func (dmabufTransport) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: "verbs-like", Capabilities: sdk.Capabilities{MemoryKinds: []sdk.MemoryKind{sdk.MemoryHostShared, sdk.MemoryDMABuf}}}, nil
}

// TestGPUModeDirectNeedsDMABuf: a transport that does not declare the
// dmabuf memory kind is refused direct mode at open, naming its kinds; one
// that does passes this check (its registration of the buffer decides).
func TestGPUModeDirectNeedsDMABuf(t *testing.T) {
	if err := checkGPUMode("direct", dmabufTransport{}); err != nil {
		t.Fatalf("direct on a dmabuf transport: %v", err)
	}
	err := checkGPUMode("direct", hostOnlyTransport{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "host-shared") {
		t.Fatalf("direct on a host-shared-only transport: %v, want FailedPrecondition naming its kinds", err)
	}
	if err := checkGPUMode("", hostOnlyTransport{}); err != nil {
		t.Fatalf("default mode: %v", err)
	}
}

// hostOnlyTransport declares host-shared memory only (Mooncake, NIXL, MORI).
type hostOnlyTransport struct{ sdk.Transport }

func (hostOnlyTransport) Info(context.Context) (sdk.Info, error) {
	return sdk.Info{Name: "host-only", Capabilities: sdk.Capabilities{MemoryKinds: []sdk.MemoryKind{sdk.MemoryHostShared}}}, nil
}
