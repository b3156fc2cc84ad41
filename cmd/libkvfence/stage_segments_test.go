package main

import (
	"bytes"
	"runtime"
	"testing"
	"unsafe"
)

// kvfence_sender_gather_segments_queued (SGLang's state row in its last
// send()): the segments are read when the copy runs on the staging
// goroutine, in order with the sender's other queued work (after what was
// queued before it, before the aux row's write_queued and the last gather
// queued after it), NULL segments are zeros and the rest of the pages is
// zero; the request is not Success on either side while the copy waits;
// bad segment lists are refused at the call. On decode,
// kvfence_receiver_scatter_segments copies the row out of the slots into
// segments (NULL: skipped) on the receiver's goroutine, and
// kvfence_receiver_read_row_at reads bytes of it in place.
func TestGatherSegmentsQueuedOrderedAndAwaited(t *testing.T) {
	dec, pre := openPairT(t)
	var e errBuf
	const page = 4096
	eng := make([]byte, 3*page) // the engine's state buffers
	for i := range eng {
		eng[i] = byte(i%253 + 1)
	}
	defer runtime.KeepAlive(eng)
	orig129 := eng[129]
	at := func(off int) unsafe.Pointer { return unsafe.Pointer(&eng[off]) }

	rv := newReceiverT(t, dec, 61)
	defer abi(kvfence_close, rv, nil)
	ranks := []uint32{1}
	if rc := abi(kvfence_receiver_init, rv, 4, unsafe.Pointer(&ranks[0]), 1, e.p()); rc != 0 {
		t.Fatalf("receiver_init: %d", rc)
	}
	sd := newSenderT(t, pre, 61, 4)
	stale := bytes.Repeat([]byte{0xee}, 3*page) // pages 0-2 as an earlier request left them
	if rc := abi(kvfence_sender_write, sd, 0, 3, unsafe.Pointer(&stale[0]), len(stale), e.p()); rc != 0 {
		t.Fatalf("sender_write: %d", rc)
	}

	// The staging goroutine is held: what runs before the segments' copy
	// changes the engine's bytes, which the copy must see.
	release, changed := make(chan struct{}), make(chan struct{})
	queue(sd, func() error {
		<-release
		copy(eng[100:], "state written before the copy")
		close(changed)
		return nil
	})
	// Row: 10 engine bytes, 8 zeros, 5000 bytes across the first page's
	// end, 30 bytes at 100: pages [1, 3) of the request.
	addrs := []unsafe.Pointer{at(7), nil, at(page), at(100)}
	lens := []int64{10, 8, 5000, 30}
	bad := map[string]struct {
		first, count, n int
		addrs           []unsafe.Pointer
		lens            []int64
	}{
		"past the pages":          {3, 2, 4, addrs, lens},
		"negative first":          {-1, 2, 4, addrs, lens},
		"a zero length":           {1, 2, 2, addrs[:2], []int64{10, 0}},
		"a negative length":       {1, 2, 2, addrs[:2], []int64{10, -8}},
		"more bytes than pages":   {1, 1, 4, addrs, lens},
		"negative count of segs":  {1, 2, -1, addrs, lens},
		"too many segments":       {1, 2, maxSegments + 1, addrs, lens},
		"one byte over the pages": {1, 2, 2, addrs[:2], []int64{page, page + 1}},
	}
	for name, b := range bad {
		if rc := abi(kvfence_sender_gather_segments_queued, sd, b.first, b.count, unsafe.Pointer(&b.addrs[0]), unsafe.Pointer(&b.lens[0]), b.n, e.p()); rc != codeInvalid {
			t.Errorf("gather_segments_queued %s: %d, want InvalidArgument", name, rc)
		}
	}
	for name, p := range badPointers(testMem(t)) {
		if rc := abi(kvfence_sender_gather_segments_queued, sd, 1, 2, p, unsafe.Pointer(&lens[0]), 4, e.p()); rc != codeInvalid {
			t.Errorf("gather_segments_queued, addresses at %s: %d, want InvalidArgument", name, rc)
		}
	}
	if rc := abi(kvfence_sender_gather_segments_queued, sd, 1, 2, unsafe.Pointer(&addrs[0]), unsafe.Pointer(&lens[0]), 4, e.p()); rc != 0 {
		t.Fatalf("gather_segments_queued: %d %s", rc, e.Message[:])
	}
	aux := []byte("aux row")
	if rc := abi(kvfence_sender_write_queued, sd, 3, 1, unsafe.Pointer(&aux[0]), len(aux), e.p()); rc != 0 {
		t.Fatalf("write_queued: %d", rc)
	}
	// Queued after the copy: a change it must not see.
	queue(sd, func() error { copy(eng[100:], "state changed after the copy!!"); return nil })
	lens1, items1 := []int64{page}, []int64{page}
	l, _ := layoutT(t, []uintptr{uintptr(unsafe.Pointer(&eng[0]))}, lens1, items1, 1)
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
	row := append(append(append(bytes.Clone(eng[7:17]), make([]byte, 8)...), eng[page:page+5000]...), "state written before the copy"...)
	row = append(row, orig129) // the segment's 30th byte: neither change's (29 bytes before the copy)
	want := append(append(bytes.Clone(eng[:page]), row...), make([]byte, 2*page-len(row))...)
	want = append(append(want, aux...), make([]byte, page-len(aux))...)
	if !bytes.Equal(got[:page], want[:page]) || !bytes.Equal(got[page:3*page], want[page:3*page]) || !bytes.Equal(got[3*page:], want[3*page:]) {
		t.Errorf("decode got other bytes: KV page %v, state row %v, aux row %v", bytes.Equal(got[:page], want[:page]),
			bytes.Equal(got[page:3*page], want[page:3*page]), bytes.Equal(got[3*page:], want[3*page:]))
	}

	// Decode: the row back into engine segments, some skipped.
	dst := make([]byte, 6000)
	defer runtime.KeepAlive(dst)
	daddrs := []unsafe.Pointer{unsafe.Pointer(&dst[0]), nil, unsafe.Pointer(&dst[100])}
	dlens := []int64{10, 8, 5030}
	for name, b := range map[string][4]int{"past the slots": {3, 2, page, 3}, "shard 0": {1, 2, 0, 3},
		"shard over a slot": {1, 2, page + 1, 3}, "more bytes than shards": {1, 1, page, 3}} {
		if rc := abi(kvfence_receiver_scatter_segments, rv, b[0], b[1], b[2], unsafe.Pointer(&daddrs[0]), unsafe.Pointer(&dlens[0]), b[3], e.p()); rc != codeInvalid {
			t.Errorf("scatter_segments %s: %d, want InvalidArgument", name, rc)
		}
	}
	zero := []int64{10, 0, 5}
	if rc := abi(kvfence_receiver_scatter_segments, rv, 1, 2, page, unsafe.Pointer(&daddrs[0]), unsafe.Pointer(&zero[0]), 3, e.p()); rc != codeInvalid {
		t.Errorf("scatter_segments with a zero length: %d, want InvalidArgument", rc)
	}
	if rc := abi(kvfence_receiver_scatter_segments, rv, 1, 2, page, unsafe.Pointer(&daddrs[0]), unsafe.Pointer(&dlens[0]), 3, e.p()); rc != 0 {
		t.Fatalf("scatter_segments: %d %s", rc, e.Message[:])
	}
	waitStage(t, kvfence_receiver_scatter_done, rv)
	wantDst := append(append(bytes.Clone(row[:10]), make([]byte, 90)...), row[18:]...)
	if !bytes.Equal(dst[:len(wantDst)], wantDst) {
		t.Errorf("scatter_segments wrote other bytes")
	}
	head := make([]byte, 12)
	if rc := abi(kvfence_receiver_read_row_at, rv, 1, 2, page, int64(page-4), unsafe.Pointer(&head[0]), len(head), e.p()); rc != 0 ||
		!bytes.Equal(head, row[page-4:page+8]) {
		t.Errorf("read_row_at across a slot's end: %d %x", rc, head)
	}
	for name, b := range map[string][2]int64{"past the row": {2*page - 11, 12}, "negative offset": {-1, 12}} {
		if rc := abi(kvfence_receiver_read_row_at, rv, 1, 2, page, b[0], unsafe.Pointer(&head[0]), b[1], e.p()); rc != codeInvalid {
			t.Errorf("read_row_at %s: %d, want InvalidArgument", name, rc)
		}
	}
	abi(kvfence_receiver_finish, rv, e.p())
}
