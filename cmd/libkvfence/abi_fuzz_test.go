package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// exported is every function of the C ABI. FuzzABI calls each with what a
// hostile or buggy caller might pass; TestExportedListComplete keeps the
// list whole.
var exported = map[string]any{
	"kvfence_version": kvfence_version, "kvfence_decode_open": kvfence_decode_open,
	"kvfence_prefill_open": kvfence_prefill_open, "kvfence_close": kvfence_close,
	"kvfence_agent_addr": kvfence_agent_addr, "kvfence_prefill_linked": kvfence_prefill_linked,
	"kvfence_prefill_quiesce": kvfence_prefill_quiesce, "kvfence_prefill_resume": kvfence_prefill_resume,
	"kvfence_agent_metrics": kvfence_agent_metrics, "kvfence_agent_stats": kvfence_agent_stats,
	"kvfence_decode_linked": kvfence_decode_linked, "kvfence_page_bytes": kvfence_page_bytes,
	"kvfence_receiver_new": kvfence_receiver_new, "kvfence_receiver_init": kvfence_receiver_init,
	"kvfence_receiver_init_at": kvfence_receiver_init_at,
	"kvfence_receiver_read":    kvfence_receiver_read, "kvfence_receiver_finish": kvfence_receiver_finish,
	"kvfence_receiver_abort": kvfence_receiver_abort, "kvfence_receiver_released": kvfence_receiver_released,
	"kvfence_sender_new": kvfence_sender_new, "kvfence_sender_init": kvfence_sender_init,
	"kvfence_sender_write": kvfence_sender_write, "kvfence_sender_send": kvfence_sender_send,
	"kvfence_sender_write_queued": kvfence_sender_write_queued, "kvfence_receiver_read_row": kvfence_receiver_read_row,
	"kvfence_sender_finish": kvfence_sender_finish, "kvfence_sender_abort": kvfence_sender_abort,
	"kvfence_poll": kvfence_poll, "kvfence_wait": kvfence_wait, "kvfence_failure": kvfence_failure,
	"kvfence_poll_go_ns": kvfence_poll_go_ns, "kvfence_page_bytes_go_ns": kvfence_page_bytes_go_ns,
	"kvfence_layout_new": kvfence_layout_new, "kvfence_sender_gather": kvfence_sender_gather,
	"kvfence_sender_gather_wait": kvfence_sender_gather_wait, "kvfence_receiver_scatter": kvfence_receiver_scatter,
	"kvfence_receiver_scatter_done": kvfence_receiver_scatter_done, "kvfence_handles_live": kvfence_handles_live,
	"kvfence_state_layout_new":           kvfence_state_layout_new,
	"kvfence_sender_gather_state_queued": kvfence_sender_gather_state_queued,
	"kvfence_receiver_scatter_state":     kvfence_receiver_scatter_state,
	"kvfence_receiver_handoff":           kvfence_receiver_handoff,
}

// fuzzWorld is a live decode and prefill rank (linked) and the handles the
// fuzzer may aim at.
type fuzzWorld struct {
	dec, pre uint64
	mem      cmem
	names    []string
}

var (
	worldOnce sync.Once
	world     fuzzWorld
)

func theWorld(t testing.TB) *fuzzWorld {
	worldOnce.Do(func() {
		world.mem = testMem(t)
		var e errBuf
		dec, pre := uint64(0), uint64(0)
		dcfg := `{"slots": 16, "shard_bytes": 4096, "shards": 2, "log_level": "off", "plugin": "` + pluginBin + `"}`
		if rc := abi(kvfence_decode_open, cstr(dcfg), unsafe.Pointer(&dec), e.p()); rc != 0 {
			t.Fatalf("decode_open: %d", rc)
		}
		addr := make([]byte, 128)
		abi(kvfence_agent_addr, dec, unsafe.Pointer(&addr[0]), len(addr), nil)
		pcfg := `{"rank": 1, "source_pages": 16, "shard_bytes": 4096, "log_level": "off", "plugin": "` + pluginBin +
			`", "decode_addr": "` + string(addr[:bytes.IndexByte(addr, 0)]) + `"}`
		if rc := abi(kvfence_prefill_open, cstr(pcfg), unsafe.Pointer(&pre), e.p()); rc != 0 {
			t.Fatalf("prefill_open: %d", rc)
		}
		world.dec, world.pre = dec, pre
		for n := range exported {
			world.names = append(world.names, n)
		}
		sortStrings(world.names)
	})
	return &world
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// fuzzIn hands out the fuzzer's bytes as choices and integers.
type fuzzIn struct{ b []byte }

func (f *fuzzIn) u64() uint64 {
	var x [8]byte
	n := copy(x[:], f.b)
	f.b = f.b[n:]
	return binary.LittleEndian.Uint64(x[:])
}

func (f *fuzzIn) pick(n int) int { return int(f.u64() % uint64(n)) }

// integer is an edge value or an arbitrary one of the parameter's kind.
func (f *fuzzIn) integer() uint64 {
	edges := []uint64{0, 1, 2, 3, 16, 4096, math.MaxInt32, 1 << 31, math.MaxUint32, math.MaxInt64, 1 << 63, math.MaxUint64}
	if i := f.pick(len(edges) + 1); i < len(edges) {
		return edges[i]
	}
	return f.u64()
}

// handle is a live handle, a fresh request, 0, a closed one or any number.
func (w *fuzzWorld) handle(f *fuzzIn, t testing.TB) uint64 {
	switch f.pick(6) {
	case 0:
		return w.dec
	case 1:
		return w.pre
	case 2:
		return newReceiverT(t, w.dec, f.u64())
	case 3:
		var h uint64
		abi(kvfence_sender_new, w.pre, f.u64(), 1, unsafe.Pointer(&h), nil)
		return h
	case 4:
		return 0
	default:
		return f.u64()
	}
}

// pointer is NULL, good memory (with fuzzed bytes, NUL-terminated), or
// memory that faults.
func (w *fuzzWorld) pointer(f *fuzzIn) unsafe.Pointer {
	bad := badPointers(w.mem)
	switch i := f.pick(4); i {
	case 0:
		return bad[[]string{"NULL", "PROT_NONE", "unmapped", "straddling", "non-canonical"}[f.pick(5)]]
	case 1:
		// Good memory ending at the guard page, holding fuzzed bytes.
		n := min(f.pick(4096), len(f.b))
		off := cmemBytes - 1 - n
		copy(w.mem.rw[off:], f.b[:n])
		w.mem.rw[cmemBytes-1] = 0xff // no NUL before the guard page
		return unsafe.Pointer(&w.mem.rw[off])
	default:
		clear(w.mem.rw[:8192])
		copy(w.mem.rw[:4096], f.b)
		return unsafe.Pointer(&w.mem.rw[0])
	}
}

// FuzzABI calls every exported function with arbitrary handles, integers,
// sizes and NULL, faulting or good pointers. The process must survive and
// every result be 0, a state, or a kvfence code (negated for poll-style).
func FuzzABI(f *testing.F) {
	for i := range len(exported) {
		f.Add([]byte{byte(i), 0, 0, 0, 0, 0, 0, 0, 2})
	}
	f.Add([]byte(`{"slots": 1, "shard_bytes": 4096}`))
	f.Fuzz(fuzzOne)
}

// fuzzOne is one FuzzABI call.
func fuzzOne(t *testing.T, data []byte) {
	{
		w := theWorld(t)
		in := &fuzzIn{b: data}
		name := w.names[in.pick(len(w.names))]
		fn := exported[name]
		ft := reflect.TypeOf(fn)
		args := make([]any, ft.NumIn())
		for i := range args {
			args[i] = w.arg(t, in, name, i, ft.In(i))
		}
		rc := abi(fn, args...)
		if rc < -9 || (ft.Out(0).Kind() == reflect.Int32 && rc > 9) {
			t.Fatalf("%s(%v) = %d: not a state or a code", name, args, rc)
		}
		// A handle the fuzzer made is closed; the ranks are never.
		for _, a := range args {
			if h, ok := a.(uint64); ok && h != w.dec && h != w.pre {
				abi(kvfence_close, h, nil)
			}
		}
	}
}

// arg is argument i of exported function name.
func (w *fuzzWorld) arg(t testing.TB, in *fuzzIn, name string, i int, pt reflect.Type) any {
	switch {
	case pt.Kind() == reflect.Ptr || pt.Kind() == reflect.UnsafePointer:
		p := w.pointer(in)
		if (name == "kvfence_decode_open" || name == "kvfence_prefill_open") && i == 0 && w.startsSomething(p) {
			// A config that names a plugin or a log file would start
			// processes or create files: not the fuzzer's business.
			copy(w.mem.rw, "{\"slots\": 0}\x00")
			return unsafe.Pointer(&w.mem.rw[0])
		}
		return p
	case i == 0 && pt.Kind() == reflect.Uint64 && name != "kvfence_close":
		return w.handle(in, t)
	case i == 0 && name == "kvfence_close":
		if h := w.handle(in, t); h != w.dec && h != w.pre {
			return h
		}
		return uint64(0)
	case name == "kvfence_wait" || name == "kvfence_sender_gather_wait" || name == "kvfence_receiver_scatter_done":
		// Negative is refused; a huge wait on a fresh request would block
		// here (TestWaitReturnsWhenItsHandleCloses covers the clamp).
		if v := int64(in.integer()); v < 0 {
			return v
		}
		return int64(in.pick(20))
	case name == "kvfence_poll_go_ns" || name == "kvfence_page_bytes_go_ns":
		if v := int64(in.integer()); v <= 0 || v > 1<<24 {
			return v
		}
		return int64(1 + in.pick(1000))
	default:
		return in.integer()
	}
}

// startsSomething: p is good memory whose config could name a plugin or a
// log file (encoding/json matches keys case-insensitively and unescapes).
func (w *fuzzWorld) startsSomething(p unsafe.Pointer) bool {
	lo, hi := uintptr(unsafe.Pointer(&w.mem.rw[0])), uintptr(w.mem.guard)
	if uintptr(p) < lo || uintptr(p) >= hi {
		return false
	}
	b := w.mem.rw[uintptr(p)-lo:]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	l := bytes.ToLower(b)
	return bytes.Contains(l, []byte("plugin")) || bytes.Contains(l, []byte("log_file")) || bytes.ContainsRune(b, '\\')
}

// exportedNamesInSource lists the //export lines of the package's files.
func exportedNamesInSource(t *testing.T) []string {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			if n, ok := strings.CutPrefix(line, "//export "); ok {
				names = append(names, strings.TrimSpace(n))
			}
		}
	}
	return names
}

func TestExportedListComplete(t *testing.T) {
	src := exportedNamesInSource(t)
	for _, n := range src {
		if _, ok := exported[n]; !ok {
			t.Errorf("%s is exported but FuzzABI does not call it", n)
		}
	}
	if len(src) != len(exported) {
		t.Errorf("%d functions exported, FuzzABI knows %d", len(src), len(exported))
	}
}
