package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// The TCP plugin declares a tail of its write TTL + 1 s (plugins/tcp):
// 11 s by default, 2 s with KVFENCE_TCP_WRITE_TTL=1s.
const shortTTL = `"plugin_env": ["KVFENCE_TCP_WRITE_TTL=1s"]`

func errMsg(e *errBuf) string {
	return string(e.Message[:max(bytes.IndexByte(e.Message[:], 0), 0)])
}

// max_declared_tail_ms is a decode key: negative is refused with a message
// naming it; zero is the default.
func TestMaxDeclaredTailBadValuesRefused(t *testing.T) {
	for _, v := range []string{"-1", "-5000", "604800001"} {
		var h uint64
		var e errBuf
		cfg := withPlugin(`{"slots": 4, "shard_bytes": 64, "max_declared_tail_ms": ` + v + `}`)
		if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
			t.Errorf("max_declared_tail_ms %s: code %d, want INVALID_ARGUMENT", v, rc)
			abi(kvfence_close, h, nil)
			continue
		}
		if msg := errMsg(&e); !strings.Contains(msg, "max_declared_tail_ms "+v) {
			t.Errorf("max_declared_tail_ms %s: message does not name the key and value: %q", v, msg)
		}
	}
	var h uint64
	var e errBuf
	if rc := abi(kvfence_decode_open, cstr(withPlugin(`{"slots": 4, "shard_bytes": 64, "max_declared_tail_ms": 0}`)), unsafe.Pointer(&h), e.p()); rc != 0 {
		t.Fatalf("max_declared_tail_ms 0 (the default): code %d %s", rc, errMsg(&e))
	}
	abi(kvfence_close, h, nil)
}

// A configured maximum below this rank's own transport's tail would not
// bound the holds (they wait out the larger of the two): refused at open,
// before anything is registered, naming both.
func TestOwnTailAboveMaxDeclaredTailRefusedAtOpen(t *testing.T) {
	var h uint64
	var e errBuf
	cfg := withPlugin(`{"slots": 4, "shard_bytes": 4096, "max_declared_tail_ms": 5000}`) // the plugin declares 11 s
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
		abi(kvfence_close, h, nil)
		t.Fatalf("own tail 11s over max_declared_tail_ms 5000: code %d, want INVALID_ARGUMENT", rc)
	}
	if msg := errMsg(&e); !strings.Contains(msg, "11s") || !strings.Contains(msg, "max_declared_tail_ms 5000") {
		t.Errorf("message names neither value: %q", msg)
	}
	cfg = withPlugin(`{"slots": 4, "shard_bytes": 4096, "max_declared_tail_ms": 5000, ` + shortTTL + `}`)
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&h), e.p()); rc != 0 {
		t.Fatalf("own tail 2s under max_declared_tail_ms 5000: code %d %s", rc, errMsg(&e))
	}
	abi(kvfence_close, h, nil)
}

// max_declared_tail_ms reaches the core: a prefill rank whose Hello
// declares a longer tail is refused at link time; one within it links.
func TestMaxDeclaredTailRefusesLongerRankTail(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "decode.log")
	var dec uint64
	var e errBuf
	cfg := fmt.Sprintf(`{"slots": 8, "shard_bytes": 4096, "max_declared_tail_ms": 5000, "plugin": %q, "log_level": "error", "log_file": %q, %s}`,
		pluginBin, logPath, shortTTL)
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&dec), e.p()); rc != 0 {
		t.Fatalf("decode_open: %d %s", rc, errMsg(&e))
	}
	t.Cleanup(func() { abi(kvfence_close, dec, nil) })
	addr := make([]byte, 128)
	abi(kvfence_agent_addr, dec, unsafe.Pointer(&addr[0]), len(addr), nil)
	daddr := string(addr[:bytes.IndexByte(addr, 0)])

	openPre := func(rank int, env string) uint64 {
		var pre uint64
		pcfg := fmt.Sprintf(`{"rank": %d, "source_pages": 8, "shard_bytes": 4096, "log_level": "off", "plugin": %q, "decode_addr": %q%s}`,
			rank, pluginBin, daddr, env)
		if rc := abi(kvfence_prefill_open, cstr(pcfg), unsafe.Pointer(&pre), e.p()); rc != 0 {
			t.Fatalf("prefill_open: %d %s", rc, errMsg(&e))
		}
		t.Cleanup(func() { abi(kvfence_close, pre, nil) })
		return pre
	}
	long := openPre(1, "") // declares 11 s
	short := openPre(2, ", "+shortTTL)
	for abi(kvfence_prefill_linked, short) != 1 || abi(kvfence_decode_linked, dec, 2) != 1 {
		time.Sleep(10 * time.Millisecond) // the test's timeout bounds it
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if bytes.Contains(b, []byte("refusing prefill rank")) && bytes.Contains(b, []byte("11s is above this decode rank's maximum 5s")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 1's 11s tail was not refused against max_declared_tail_ms 5000; decode log:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if abi(kvfence_prefill_linked, long) == 1 || abi(kvfence_decode_linked, dec, 1) == 1 {
		t.Fatal("rank 1 declares an 11s tail over max_declared_tail_ms 5000 and linked")
	}
}

// SGLang's direct mode fits every hold into SGLang's deferred-release
// timeout through max_declared_tail_ms (python/kvfence/sglang_direct.py).
// The restart fence would let a rank declare a longer tail whose holds
// never end by timeout, and SGLang frees the pages at its timeout
// regardless: the C ABI offers no way to enable it. A decode key that
// does must be refused with gpu_mode "direct" first.
func TestDecodeConfigHasNoRestartFence(t *testing.T) {
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		for i := range ty.NumField() {
			f := ty.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			if tag := f.Tag.Get("json"); strings.Contains(strings.ToLower(f.Name+tag), "restart") {
				t.Errorf("decode config key %q (%s) may enable a restart fence: refuse it in direct mode (docs/gpu-direct.md), then update this test", tag, f.Name)
			}
		}
	}
	walk(reflect.TypeFor[decodeJSON]())
	var h uint64
	var e errBuf
	cfg := withPlugin(`{"slots": 4, "shard_bytes": 64, "restart_fence_instances": 2}`)
	if rc := abi(kvfence_decode_open, cstr(cfg), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
		abi(kvfence_close, h, nil)
		t.Errorf("restart_fence_instances: code %d, want INVALID_ARGUMENT (unknown field)", rc)
	}
}
