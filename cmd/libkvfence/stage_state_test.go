package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// stateFixture is an engine's state buffers (three types: Mamba, SWA with
// an item-less buffer among its buffers, DSA) and their C description.
type stateFixture struct {
	paged  []int32
	bounds []int64
	nbufs  []int32
	ptrs   []unsafe.Pointer
	lens   []int64
	items  []int64
	bufs   [][][]byte // per type, per buffer
}

func newStateFixture(seed byte) *stateFixture {
	f := &stateFixture{paged: []int32{0, 1, 1}, bounds: []int64{1, 40, 10}, nbufs: []int32{2, 3, 1}}
	for t, its := range [][]int64{{100, 36}, {64, 0, 32}, {200}} {
		var bs [][]byte
		for b, item := range its {
			n := 20*item + 7 // 20 indices fit, plus a few bytes
			if item == 0 {
				n = 16
			}
			buf := make([]byte, n)
			for i := range buf {
				buf[i] = byte(i*7+t*31+b*13) ^ seed
			}
			bs = append(bs, buf)
			f.ptrs = append(f.ptrs, unsafe.Pointer(&buf[0]))
			f.lens, f.items = append(f.lens, int64(n)), append(f.items, item)
		}
		f.bufs = append(f.bufs, bs)
	}
	return f
}

func (f *stateFixture) register(t *testing.T) uint64 {
	t.Helper()
	var e errBuf
	var h uint64
	if rc := abi(kvfence_state_layout_new, len(f.paged), unsafe.Pointer(&f.paged[0]), unsafe.Pointer(&f.bounds[0]), unsafe.Pointer(&f.nbufs[0]),
		unsafe.Pointer(&f.ptrs[0]), unsafe.Pointer(&f.lens[0]), unsafe.Pointer(&f.items[0]), unsafe.Pointer(&h), e.p()); rc != 0 {
		t.Fatalf("state_layout_new: %d %s", rc, e.Message[:])
	}
	return h
}

// row is the reference expansion of a request's state row, written out as
// kvfence/sglang_state.py's read_row defines it.
func (f *stateFixture) row(idx [][]int64) []byte {
	var row []byte
	j := 0
	for t := range f.paged {
		per := int64(0)
		for b := range f.nbufs[t] {
			per += f.items[j+int(b)]
		}
		if f.paged[t] != 0 {
			row = binary.LittleEndian.AppendUint32(row, uint32(len(idx[t])))
			row = binary.LittleEndian.AppendUint32(row, uint32(per))
		}
		for _, i := range idx[t] {
			for b, buf := range f.bufs[t] {
				item := f.items[j+b]
				row = append(row, buf[i*item:(i+1)*item]...)
			}
		}
		row = append(row, make([]byte, (f.bounds[t]-int64(len(idx[t])))*per)...)
		j += int(f.nbufs[t])
	}
	return row
}

// indexArgs is (pointer array, counts) of per-type index arrays.
func indexArgs(idx [][]int64) ([]unsafe.Pointer, []int64) {
	ps, ns := make([]unsafe.Pointer, len(idx)), make([]int64, len(idx))
	for t, ix := range idx {
		if len(ix) > 0 {
			ps[t] = unsafe.Pointer(&ix[0])
		}
		ns[t] = int64(len(ix))
	}
	return ps, ns
}

func lastJob(h uint64) *job {
	jobs.Lock()
	defer jobs.Unlock()
	return jobs.last[h]
}

// kvfence_state_layout_new refuses what does not describe host state
// buffers.
func TestStateLayoutRefusals(t *testing.T) {
	f := newStateFixture(0)
	defer runtime.KeepAlive(f)
	var e errBuf
	var h uint64
	call := func(n int, paged []int32, bounds []int64, nbufs []int32, lens, items []int64) int64 {
		return abi(kvfence_state_layout_new, n, unsafe.Pointer(&paged[0]), unsafe.Pointer(&bounds[0]), unsafe.Pointer(&nbufs[0]),
			unsafe.Pointer(&f.ptrs[0]), unsafe.Pointer(&lens[0]), unsafe.Pointer(&items[0]), unsafe.Pointer(&h), e.p())
	}
	with := func(s []int64, i int, v int64) []int64 { s = append([]int64(nil), s...); s[i] = v; return s }
	for name, rc := range map[string]int64{
		"no types":               call(0, f.paged, f.bounds, f.nbufs, f.lens, f.items),
		"65 types":               call(65, f.paged, f.bounds, f.nbufs, f.lens, f.items),
		"a Mamba bound of 0":     call(3, f.paged, with(f.bounds, 0, 0), f.nbufs, f.lens, f.items),
		"a negative bound":       call(3, f.paged, with(f.bounds, 1, -1), f.nbufs, f.lens, f.items),
		"a bound over 2^32-1":    call(3, f.paged, with(f.bounds, 1, math.MaxUint32+1), f.nbufs, f.lens, f.items),
		"negative buffers":       call(3, f.paged, f.bounds, []int32{2, -1, 1}, f.lens, f.items),
		"too many buffers":       call(3, f.paged, f.bounds, []int32{2, maxStateBufs, 1}, f.lens, f.items),
		"a negative length":      call(3, f.paged, f.bounds, f.nbufs, with(f.lens, 2, -1), f.items),
		"a negative item":        call(3, f.paged, f.bounds, f.nbufs, f.lens, with(f.items, 3, -1)),
		"a header's per too big": call(3, f.paged, f.bounds, f.nbufs, f.lens, with(f.items, 2, math.MaxUint32)),
	} {
		if rc != codeInvalid {
			t.Errorf("state_layout_new, %s: %d, want InvalidArgument", name, rc)
		}
	}
	nilPtr := []unsafe.Pointer{nil}
	one := []int64{64}
	if rc := abi(kvfence_state_layout_new, 1, unsafe.Pointer(&f.paged[0]), unsafe.Pointer(&f.bounds[0]), unsafe.Pointer(&[]int32{1}[0]),
		unsafe.Pointer(&nilPtr[0]), unsafe.Pointer(&one[0]), unsafe.Pointer(&one[0]), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
		t.Errorf("state_layout_new, a NULL buffer: %d, want InvalidArgument", rc)
	}
	for name, p := range badPointers(testMem(t)) {
		if rc := abi(kvfence_state_layout_new, 3, unsafe.Pointer(&f.paged[0]), unsafe.Pointer(&f.bounds[0]), unsafe.Pointer(&f.nbufs[0]),
			p, unsafe.Pointer(&f.lens[0]), unsafe.Pointer(&f.items[0]), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
			t.Errorf("state_layout_new, buffers at %s: %d, want InvalidArgument", name, rc)
		}
	}
	l := f.register(t)
	if rc := abi(kvfence_close, l, nil); rc != 0 {
		t.Errorf("close: %d", rc)
	}
}

// kvfence_sender_gather_state_queued (SGLang's last send()): the row is
// expanded from the registered buffers and the index arrays on the staging
// goroutine, in order with the sender's other queued work (after what was
// queued before it, before the aux row's write_queued and the last gather
// queued after it), byte for byte the reference row, zero to the pages'
// end; the request is not Success on either side while the copy waits;
// bad index arrays are refused at the call with nothing queued. On decode,
// kvfence_receiver_scatter_state copies the row out of the slots into the
// engine's items on the receiver's goroutine, after checking the SWA/DSA
// headers at the call (FailedPrecondition, nothing queued or written).
func TestGatherStateQueuedOrderedAndAwaited(t *testing.T) {
	dec, pre := openPairT(t)
	var e errBuf
	const page = 4096
	f := newStateFixture(0)
	defer runtime.KeepAlive(f)
	sl := f.register(t)
	defer abi(kvfence_close, sl, nil)

	rv := newReceiverT(t, dec, 62)
	defer abi(kvfence_close, rv, nil)
	ranks := []uint32{1}
	if rc := abi(kvfence_receiver_init, rv, 4, unsafe.Pointer(&ranks[0]), 1, e.p()); rc != 0 {
		t.Fatalf("receiver_init: %d", rc)
	}
	sd := newSenderT(t, pre, 62, 4)
	stale := bytes.Repeat([]byte{0xee}, 3*page) // pages 0-2 as an earlier request left them
	if rc := abi(kvfence_sender_write, sd, 0, 3, unsafe.Pointer(&stale[0]), len(stale), e.p()); rc != 0 {
		t.Fatalf("sender_write: %d", rc)
	}

	idx := [][]int64{{3}, {5, 1, 19, 0}, {15, 0, 7}}
	ps, ns := indexArgs(idx)
	// Refused at the call, nothing queued.
	before := lastJob(sd)
	for name, b := range map[string]struct {
		first, count, n int
		idx             [][]int64
	}{
		"past the pages":               {3, 2, 3, idx},
		"too few pages for the row":    {1, 1, 3, idx},
		"two index arrays":             {1, 2, 2, idx},
		"a Mamba index past its buf":   {1, 2, 3, [][]int64{{20}, idx[1], idx[2]}},
		"a negative index":             {1, 2, 3, [][]int64{idx[0], {5, -1}, idx[2]}},
		"an SWA index past one buffer": {1, 2, 3, [][]int64{idx[0], {5, 20}, idx[2]}},
		"two Mamba indices":            {1, 2, 3, [][]int64{{1, 2}, idx[1], idx[2]}},
		"no Mamba index":               {1, 2, 3, [][]int64{{}, idx[1], idx[2]}},
		"more DSA indices than bound":  {1, 2, 3, [][]int64{idx[0], idx[1], make([]int64, 11)}},
	} {
		bp, bn := indexArgs(b.idx)
		if rc := abi(kvfence_sender_gather_state_queued, sd, b.first, b.count, sl, unsafe.Pointer(&bp[0]), unsafe.Pointer(&bn[0]), b.n, e.p()); rc != codeInvalid {
			t.Errorf("gather_state_queued, %s: %d, want InvalidArgument", name, rc)
		}
	}
	if rc := abi(kvfence_sender_gather_state_queued, sd, 1, 2, rv, unsafe.Pointer(&ps[0]), unsafe.Pointer(&ns[0]), 3, e.p()); rc != codeInvalid {
		t.Errorf("gather_state_queued with a receiver for the layout: %d, want InvalidArgument", rc)
	}
	for name, p := range badPointers(testMem(t)) {
		if rc := abi(kvfence_sender_gather_state_queued, sd, 1, 2, sl, p, unsafe.Pointer(&ns[0]), 3, e.p()); rc != codeInvalid {
			t.Errorf("gather_state_queued, index arrays at %s: %d, want InvalidArgument", name, rc)
		}
	}
	if lastJob(sd) != before {
		t.Fatalf("a refused gather_state_queued queued work")
	}

	// The staging goroutine is held: what runs before the copy changes the
	// engine's bytes (Mamba index 3), which the copy must see.
	mamba := f.bufs[0][0]
	release, changed := make(chan struct{}), make(chan struct{})
	queue(sd, func() error {
		<-release
		copy(mamba[300:], "state written before the copy")
		close(changed)
		return nil
	})
	if rc := abi(kvfence_sender_gather_state_queued, sd, 1, 2, sl, unsafe.Pointer(&ps[0]), unsafe.Pointer(&ns[0]), 3, e.p()); rc != 0 {
		t.Fatalf("gather_state_queued: %d %s", rc, e.Message[:])
	}
	idx[1][0] = 9 // the caller may reuse its arrays: copied at the call
	aux := []byte("aux row")
	if rc := abi(kvfence_sender_write_queued, sd, 3, 1, unsafe.Pointer(&aux[0]), len(aux), e.p()); rc != 0 {
		t.Fatalf("write_queued: %d", rc)
	}
	// Queued after the copy: a change it must not see.
	var want []byte
	queue(sd, func() error {
		want = f.row([][]int64{{3}, {5, 1, 19, 0}, {15, 0, 7}})
		copy(mamba[300:], "state changed after the copy!!")
		return nil
	})
	// The engine's KV page outside Go's heap and stacks, as an engine's is:
	// a make here may land on the test's stack, which moves when it grows,
	// and a queued scatter then wrote into the freed old stack (seen under
	// -race: "found bad pointer in Go heap").
	kv := testMem(t).rw[:page]
	for i := range kv {
		kv[i] = byte(i % 251)
	}
	l, _ := layoutT(t, []uintptr{uintptr(unsafe.Pointer(&kv[0]))}, []int64{page}, []int64{page}, 1)
	from := []int32{0}
	if rc := abi(kvfence_sender_gather, sd, l, unsafe.Pointer(&from[0]), 1, 0, 1, 0, 4, 4, e.p()); rc != 0 {
		t.Fatalf("the last gather (send and finish): %d %s", rc, e.Message[:])
	}
	if rc := abi(kvfence_sender_gather_wait, sd, 0, e.p()); rc != 1 {
		t.Errorf("gather_wait while the copy is held: %d, want 1 (running)", rc)
	}
	if st := abi(kvfence_wait, rv, 200); st == 4 {
		t.Fatalf("decode is SUCCESS before the state copy ran")
	}
	if st := abi(kvfence_poll, sd); st == 4 {
		t.Fatalf("prefill is SUCCESS before the state copy ran")
	}
	close(release)
	<-changed
	waitStage(t, kvfence_sender_gather_wait, sd)
	if st := abi(kvfence_wait, rv, 60_000); st != 4 {
		t.Fatalf("receiver state %d, want SUCCESS", st)
	}
	got := make([]byte, 4*page)
	if rc := abi(kvfence_receiver_read, rv, 0, 4, unsafe.Pointer(&got[0]), len(got), e.p()); rc != 0 {
		t.Fatalf("receiver_read: %d", rc)
	}
	if !bytes.Contains(want, []byte("state written before the copy")) {
		t.Fatalf("the reference row lacks the change made before the copy")
	}
	row := append(bytes.Clone(want), make([]byte, 2*page-len(want))...)
	wantAll := append(append(bytes.Clone(kv), row...), aux...)
	wantAll = append(wantAll, make([]byte, page-len(aux))...)
	if !bytes.Equal(got[:page], wantAll[:page]) || !bytes.Equal(got[page:3*page], wantAll[page:3*page]) || !bytes.Equal(got[3*page:], wantAll[3*page:]) {
		t.Errorf("decode got other bytes: KV page %v, state row %v, aux row %v", bytes.Equal(got[:page], wantAll[:page]),
			bytes.Equal(got[page:3*page], wantAll[page:3*page]), bytes.Equal(got[3*page:], wantAll[3*page:]))
	}

	// Decode: the row back into another engine's items.
	d := newStateFixture(0x5a)
	defer runtime.KeepAlive(d)
	dl := d.register(t)
	defer abi(kvfence_close, dl, nil)
	snapshot := func() [][][]byte {
		var out [][][]byte
		for _, bs := range d.bufs {
			var c [][]byte
			for _, b := range bs {
				c = append(c, bytes.Clone(b))
			}
			out = append(out, c)
		}
		return out
	}
	orig := snapshot()
	didx := [][]int64{{11}, {2, 4, 6, 8}, {1, 3, 5}}
	dp, dn := indexArgs(didx)
	rbefore := lastJob(rv)
	for name, b := range map[string][4]int{"past the slots": {3, 2, page, 3}, "shard 0": {1, 2, 0, 3},
		"shard over a slot": {1, 2, page + 1, 3}, "row over the shards": {1, 2, 2000, 3}, "one index array": {1, 2, page, 1}} {
		if rc := abi(kvfence_receiver_scatter_state, rv, b[0], b[1], b[2], dl, unsafe.Pointer(&dp[0]), unsafe.Pointer(&dn[0]), b[3], e.p()); rc != codeInvalid {
			t.Errorf("scatter_state, %s: %d, want InvalidArgument", name, rc)
		}
	}
	bp, bn := indexArgs([][]int64{{11}, {2, 4, 6, 20}, {1, 3, 5}})
	if rc := abi(kvfence_receiver_scatter_state, rv, 1, 2, page, dl, unsafe.Pointer(&bp[0]), unsafe.Pointer(&bn[0]), 3, e.p()); rc != codeInvalid {
		t.Errorf("scatter_state, an index past its buffer: %d, want InvalidArgument", rc)
	}
	for name, ix := range map[string][][]int64{"three SWA indices": {{11}, {2, 4, 6}, {1, 3, 5}},
		"four DSA indices": {{11}, {2, 4, 6, 8}, {1, 3, 5, 7}}} {
		mp, mn := indexArgs(ix)
		if rc := abi(kvfence_receiver_scatter_state, rv, 1, 2, page, dl, unsafe.Pointer(&mp[0]), unsafe.Pointer(&mn[0]), 3, e.p()); rc != codeFailedPrecondition {
			t.Errorf("scatter_state, %s (prefill sent other headers): %d, want FailedPrecondition", name, rc)
		} else if !bytes.Contains(e.Message[:], []byte("state indices")) {
			t.Errorf("scatter_state, %s: %q does not name the state indices", name, e.Message[:])
		}
	}
	if lastJob(rv) != rbefore {
		t.Fatalf("a refused scatter_state queued work")
	}
	if rc := abi(kvfence_receiver_scatter_state, rv, 1, 2, page, dl, unsafe.Pointer(&dp[0]), unsafe.Pointer(&dn[0]), 3, e.p()); rc != 0 {
		t.Fatalf("scatter_state: %d %s", rc, e.Message[:])
	}
	waitStage(t, kvfence_receiver_scatter_done, rv)
	// Expected: the other buffers unchanged, decode's indices hold the
	// items of prefill's indices in order.
	wantD := orig
	j := 0
	for ty := range d.bufs {
		for b := range d.bufs[ty] {
			item := int(d.items[j+b])
			for k, i := range didx[ty] {
				pi := int([][]int64{{3}, {5, 1, 19, 0}, {15, 0, 7}}[ty][k])
				src := f.bufs[ty][b][pi*item : (pi+1)*item]
				if ty == 0 && b == 0 {
					src = want[:item] // the Mamba item as copied (its buffer changed after the copy)
				}
				copy(wantD[ty][b][int(i)*item:], src)
			}
		}
		j += int(d.nbufs[ty])
	}
	for ty := range d.bufs {
		for b := range d.bufs[ty] {
			if !bytes.Equal(d.bufs[ty][b], wantD[ty][b]) {
				t.Errorf("scatter_state: type %d buffer %d holds other bytes", ty, b)
			}
		}
	}

	// kvfence_receiver_handoff: the same copy with the KV scatter and the
	// aux row read in one call; a header refusal reads and queues nothing.
	for ty := range d.bufs {
		for b := range d.bufs[ty] {
			copy(d.bufs[ty][b], orig[ty][b])
		}
	}
	to := []int32{0}
	auxGot := bytes.Repeat([]byte{0x5c}, len(aux))
	mp, mn := indexArgs([][]int64{{11}, {2, 4, 6}, {1, 3, 5}})
	rbefore = lastJob(rv)
	if rc := abi(kvfence_receiver_handoff, rv, l, unsafe.Pointer(&to[0]), 1, 1, 0, 1, 2, page, dl, unsafe.Pointer(&mp[0]), unsafe.Pointer(&mn[0]), 3,
		3, 1, page, unsafe.Pointer(&auxGot[0]), len(auxGot), e.p()); rc != codeFailedPrecondition {
		t.Errorf("handoff, prefill sent other headers: %d, want FailedPrecondition", rc)
	}
	if lastJob(rv) != rbefore || !bytes.Equal(auxGot, bytes.Repeat([]byte{0x5c}, len(aux))) {
		t.Fatalf("a refused handoff queued work or read the aux row")
	}
	if rc := abi(kvfence_receiver_handoff, rv, l, unsafe.Pointer(&to[0]), 1, 1, 0, 1, 2, page, dl, unsafe.Pointer(&dp[0]), unsafe.Pointer(&dn[0]), 3,
		3, 1, page, unsafe.Pointer(&auxGot[0]), len(auxGot), e.p()); rc != 0 {
		t.Fatalf("handoff: %d %s", rc, e.Message[:])
	}
	if !bytes.Equal(auxGot, aux) {
		t.Errorf("handoff read aux row %q, want %q", auxGot, aux)
	}
	waitStage(t, kvfence_receiver_scatter_done, rv)
	for ty := range d.bufs {
		for b := range d.bufs[ty] {
			if !bytes.Equal(d.bufs[ty][b], wantD[ty][b]) {
				t.Errorf("handoff: type %d buffer %d holds other bytes", ty, b)
			}
		}
	}
	if !bytes.Equal(kv, got[:page]) {
		t.Errorf("handoff: the KV page scattered holds other bytes")
	}

	abi(kvfence_receiver_finish, rv, e.p())
	for abi(kvfence_receiver_released, rv) != 1 {
		time.Sleep(time.Millisecond) // released in the agent's loop; the test's deadline bounds it
	}
	after := snapshot()
	if rc := abi(kvfence_receiver_scatter_state, rv, 1, 2, page, dl, unsafe.Pointer(&dp[0]), unsafe.Pointer(&dn[0]), 3, e.p()); rc != codeFailedPrecondition {
		t.Errorf("scatter_state after release: %d, want FailedPrecondition", rc)
	}
	if rc := abi(kvfence_receiver_handoff, rv, l, unsafe.Pointer(&to[0]), 1, 1, 0, 1, 2, page, dl, unsafe.Pointer(&dp[0]), unsafe.Pointer(&dn[0]), 3,
		3, 1, page, unsafe.Pointer(&auxGot[0]), len(auxGot), e.p()); rc != codeFailedPrecondition {
		t.Errorf("handoff after release: %d, want FailedPrecondition", rc)
	}
	waitStage(t, kvfence_receiver_scatter_done, rv)
	for ty := range d.bufs {
		for b := range d.bufs[ty] {
			if !bytes.Equal(d.bufs[ty][b], after[ty][b]) {
				t.Errorf("scatter_state after release wrote type %d buffer %d", ty, b)
			}
		}
	}
}

// A caller's pointer array that is readable but not 8-byte aligned is
// refused, never copied: kvfence_state_layout_new once bulk-copied it, and
// a copy made while a GC was marking threw in the write barrier
// ("bulkBarrierPreWrite: unaligned arguments") and killed the process (a
// CI run). A GC runs in a loop beside the calls, so that most of them meet
// a marking phase.
func TestMisalignedArraysRefusedWhileGCMarks(t *testing.T) {
	f := newStateFixture(0)
	defer runtime.KeepAlive(f)
	mem, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	defer syscall.Munmap(mem)
	odd := unsafe.Pointer(&mem[4]) // zeros: NULL buffers, were they read
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	defer func() { close(stop); <-done }()
	var e errBuf
	var h uint64
	for i := range 1000 {
		if rc := abi(kvfence_state_layout_new, 3, unsafe.Pointer(&f.paged[0]), unsafe.Pointer(&f.bounds[0]), unsafe.Pointer(&f.nbufs[0]),
			odd, unsafe.Pointer(&f.lens[0]), unsafe.Pointer(&f.items[0]), unsafe.Pointer(&h), e.p()); rc != codeInvalid {
			t.Fatalf("state_layout_new, call %d, misaligned buffers: %d, want InvalidArgument", i, rc)
		}
		if rc := abi(kvfence_layout_new, odd, unsafe.Pointer(&f.lens[0]), unsafe.Pointer(&f.items[0]), 3, 16, unsafe.Pointer(&h), e.p()); rc != codeInvalid {
			t.Fatalf("layout_new, call %d, misaligned buffers: %d, want InvalidArgument", i, rc)
		}
	}
}
