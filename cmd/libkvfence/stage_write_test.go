package main

import (
	"bytes"
	"testing"
	"time"
	"unsafe"
)

// kvfence_sender_write_queued (SGLang's aux row in its last send()): the
// row is copied at the call, written after the gathers queued before it,
// zero-padded to whole pages (a source page may hold an earlier request's
// bytes), and sent by the next gather's send; bad input is refused at the
// call with nothing queued; after an abort the queued write refuses. On
// decode, kvfence_receiver_read_row reads the row back (checkReadRow).
func TestWriteQueuedAfterGathersZeroPadded(t *testing.T) {
	dec, pre := openPairT(t)
	m := testMem(t)
	var e errBuf
	const item = 4096
	eng := m.rw[:4*item] // the engine's KV buffer: 4 pages of one 4 KiB item
	for i := range eng {
		eng[i] = byte(i/item*31 + i%251 + 1)
	}
	lens, items := []int64{int64(len(eng))}, []int64{item}
	l, _ := layoutT(t, []uintptr{uintptr(unsafe.Pointer(&eng[0]))}, lens, items, 1)

	rv := newReceiverT(t, dec, 51)
	defer abi(kvfence_close, rv, nil)
	ranks := []uint32{1}
	if rc := abi(kvfence_receiver_init, rv, 3, unsafe.Pointer(&ranks[0]), 1, e.p()); rc != 0 {
		t.Fatalf("receiver_init: %d", rc)
	}
	sd := newSenderT(t, pre, 51, 3)
	stale := bytes.Repeat([]byte{0xff}, item) // page 2 as an earlier request left it
	if rc := abi(kvfence_sender_write, sd, 2, 1, unsafe.Pointer(&stale[0]), item, e.p()); rc != 0 {
		t.Fatalf("sender_write: %d", rc)
	}
	from := []int32{3, 1}
	if rc := abi(kvfence_sender_gather, sd, l, unsafe.Pointer(&from[0]), 2, 0, 1, 0, 0, 0, e.p()); rc != 0 {
		t.Fatalf("sender_gather: %d %s", rc, e.Message[:])
	}
	row := []byte("aux row: ids and room")
	for name, p := range badPointers(m) {
		if rc := abi(kvfence_sender_write_queued, sd, 2, 1, p, len(row), e.p()); rc != codeInvalid {
			t.Errorf("write_queued from %s: %d, want InvalidArgument", name, rc)
		}
	}
	for name, args := range map[string][3]int{"past the pages": {3, 1, 8}, "more than count pages": {2, 1, item + 1}, "negative count": {2, -1, 0}} {
		if rc := abi(kvfence_sender_write_queued, sd, args[0], args[1], unsafe.Pointer(&row[0]), args[2], e.p()); rc != codeInvalid {
			t.Errorf("write_queued %s: %d, want InvalidArgument", name, rc)
		}
	}
	if rc := abi(kvfence_sender_write_queued, sd, 2, 1, unsafe.Pointer(&row[0]), len(row), e.p()); rc != 0 {
		t.Fatalf("write_queued: %d %s", rc, e.Message[:])
	}
	copy(row, "the caller reused its buffer")
	if rc := abi(kvfence_sender_gather, sd, l, unsafe.Pointer(&from[0]), 0, 0, 1, 2, 3, 3, e.p()); rc != 0 {
		t.Fatalf("the last gather (send and finish): %d %s", rc, e.Message[:])
	}
	waitStage(t, kvfence_sender_gather_wait, sd)
	if st := abi(kvfence_wait, rv, 60_000); st != 4 {
		t.Fatalf("receiver state %d, want SUCCESS", st)
	}
	got := make([]byte, 3*item)
	if rc := abi(kvfence_receiver_read, rv, 0, 3, unsafe.Pointer(&got[0]), len(got), e.p()); rc != 0 {
		t.Fatalf("receiver_read: %d", rc)
	}
	want := append(append(bytes.Clone(eng[3*item:4*item]), eng[item:2*item]...), "aux row: ids and room"...)
	want = append(want, make([]byte, 3*item-len(want))...)
	if !bytes.Equal(got, want) {
		t.Errorf("decode got other bytes: pages equal %v %v %v (page 2 begins %q)", bytes.Equal(got[:item], want[:item]),
			bytes.Equal(got[item:2*item], want[item:2*item]), bytes.Equal(got[2*item:], want[2*item:]), got[2*item:2*item+32])
	}
	checkReadRow(t, rv, got, item)
	abi(kvfence_receiver_finish, rv, e.p())
	refusedOnceReleased(t, rv, l, eng)

	ab := newSenderT(t, pre, 52, 1)
	abi(kvfence_sender_abort, ab, e.p())
	if rc := abi(kvfence_sender_write_queued, ab, 0, 1, unsafe.Pointer(&row[0]), len(row), e.p()); rc != 0 {
		t.Fatalf("write_queued after an abort: %d (the refusal comes from the queued write)", rc)
	}
	if rc := abi(kvfence_sender_gather_wait, ab, 60_000, e.p()); rc != -codeFailedPrecondition {
		t.Errorf("a queued write after the abort: %d, want -FAILED_PRECONDITION", rc)
	}
}

// refusedOnceReleased: once the finished receiver rv's slots went back,
// the calls that read them (aux row, KV scatter into eng through layout
// l, whole pages) refuse with FailedPrecondition and copy nothing: the
// handed-off pages are published by the agent's loop at handoff and
// cleared at release, and a stale copy would read slots another request
// may own by now.
func refusedOnceReleased(t *testing.T, rv, l uint64, eng []byte) {
	t.Helper()
	var e errBuf
	for abi(kvfence_receiver_released, rv) != 1 {
		time.Sleep(time.Millisecond) // released in the agent's loop; the test's deadline bounds it
	}
	slot := len(eng) / 4
	row := bytes.Repeat([]byte{0x5c}, slot)
	if rc := abi(kvfence_receiver_read_row, rv, 2, 1, slot, unsafe.Pointer(&row[0]), 21, e.p()); rc != codeFailedPrecondition ||
		!bytes.Equal(row, bytes.Repeat([]byte{0x5c}, slot)) {
		t.Errorf("read_row after release: %d %q, want FailedPrecondition and nothing copied", rc, row[:21])
	}
	if rc := abi(kvfence_receiver_read, rv, 0, 1, unsafe.Pointer(&row[0]), slot, e.p()); rc != codeFailedPrecondition ||
		!bytes.Equal(row, bytes.Repeat([]byte{0x5c}, slot)) {
		t.Errorf("read after release: %d, want FailedPrecondition and nothing copied", rc)
	}
	before := bytes.Clone(eng)
	to := []int32{0}
	if rc := abi(kvfence_receiver_scatter, rv, l, unsafe.Pointer(&to[0]), 1, 1, 0, e.p()); rc != codeFailedPrecondition {
		t.Errorf("scatter after release: %d, want FailedPrecondition", rc)
	}
	if rc := abi(kvfence_receiver_handoff, rv, l, unsafe.Pointer(&to[0]), 1, 1, 0, 0, 0, 0, 0, nil, nil, 0,
		2, 1, slot, unsafe.Pointer(&row[0]), 21, e.p()); rc != codeFailedPrecondition || !bytes.Equal(row, bytes.Repeat([]byte{0x5c}, slot)) {
		t.Errorf("handoff after release: %d, want FailedPrecondition and nothing copied", rc)
	}
	waitStage(t, kvfence_receiver_scatter_done, rv)
	if !bytes.Equal(eng, before) {
		t.Errorf("a scatter after release wrote the engine's pages")
	}
}

// checkReadRow: kvfence_receiver_read_row gives the row shard 0 of
// consecutive slots hold (got: the request's slots as read whole), only
// its bytes, and refuses rows past the slots or longer than their shards.
func checkReadRow(t *testing.T, rv uint64, got []byte, slot int) {
	t.Helper()
	var e errBuf
	row := make([]byte, 21)
	if rc := abi(kvfence_receiver_read_row, rv, 2, 1, slot, unsafe.Pointer(&row[0]), len(row), e.p()); rc != 0 || string(row) != "aux row: ids and room" {
		t.Errorf("read_row of the aux row: %d %q", rc, row)
	}
	const shard = 8 // two slots' first 8 bytes, the row 12 bytes long
	if rc := abi(kvfence_receiver_read_row, rv, 1, 2, shard, unsafe.Pointer(&row[0]), 12, e.p()); rc != 0 ||
		!bytes.Equal(row[:12], append(bytes.Clone(got[slot:slot+shard]), got[2*slot:2*slot+4]...)) {
		t.Errorf("read_row across two slots: %d %x", rc, row[:12])
	}
	for name, args := range map[string][4]int{"past the slots": {2, 2, shard, 8}, "longer than the shards": {1, 2, shard, 17},
		"shard 0": {0, 1, 0, 0}, "shard over a slot": {0, 1, slot + 1, 8}} {
		if rc := abi(kvfence_receiver_read_row, rv, args[0], args[1], args[2], unsafe.Pointer(&row[0]), args[3], e.p()); rc != codeInvalid {
			t.Errorf("read_row %s: %d, want InvalidArgument", name, rc)
		}
	}
}

// newSenderT makes prefill pre's sender of room with pages source pages,
// closed at test end.
func newSenderT(t *testing.T, pre, room uint64, pages int) uint64 {
	t.Helper()
	var sd uint64
	var e errBuf
	if rc := abi(kvfence_sender_new, pre, room, 1, unsafe.Pointer(&sd), e.p()); rc != 0 {
		t.Fatalf("sender_new: %d", rc)
	}
	t.Cleanup(func() { abi(kvfence_close, sd, nil) })
	if rc := abi(kvfence_sender_init, sd, pages, e.p()); rc != 0 {
		t.Fatalf("sender_init: %d", rc)
	}
	return sd
}
