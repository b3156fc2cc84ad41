package sdk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// testRings is a fresh layout with a producer and a consumer view of its
// submission ring, as host and plugin would hold them.
func testRings(capacity uint64) (prod, cons *ring, mem []byte) {
	mem = make([]byte, ringLayoutSize(capacity))
	initRingLayout(mem, capacity)
	return submissionRing(mem, capacity), submissionRing(mem, capacity), mem
}

// payloadFor is a payload whose bytes are derived from seq and length, so
// a record read with the wrong, torn or shifted bytes is detected.
func payloadFor(seq uint64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(seq*31 + uint64(i)*7)
	}
	return p
}

// Any interleaving of puts, publishes and reads delivers exactly the
// published records, in order, byte for byte, across wraps.
func TestRingRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prod, cons, _ := testRings(ringMinCapacity)
		var sent, got []uint64
		sizes := map[uint64]int{}
		var seq uint64
		var buf []byte
		for range rapid.IntRange(1, 300).Draw(t, "steps") {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				n := rapid.IntRange(0, int(prod.maxPayload())).Draw(t, "len")
				seq++
				err := prod.put(recPost, seq, payloadFor(seq, n))
				if errors.Is(err, errRingFull) {
					seq--
					continue
				}
				if err != nil {
					t.Fatalf("put: %v", err)
				}
				sizes[seq] = n
				sent = append(sent, seq)
			case 1:
				prod.publish()
			case 2:
				kind, s, p, b, ok, err := cons.next(buf)
				buf = b
				if err != nil {
					t.Fatalf("next: %v", err)
				}
				if !ok {
					continue
				}
				if kind != recPost || !bytes.Equal(p, payloadFor(s, sizes[s])) {
					t.Fatalf("record %d: kind %d, %d bytes, wrong content", s, kind, len(p))
				}
				got = append(got, s)
			}
		}
		prod.publish()
		for {
			_, s, _, b, ok, err := cons.next(buf)
			buf = b
			if err != nil {
				t.Fatalf("next: %v", err)
			}
			if !ok {
				break
			}
			got = append(got, s)
		}
		if len(got) != len(sent) {
			t.Fatalf("got %d records, sent %d", len(got), len(sent))
		}
		for i := range got {
			if got[i] != sent[i] {
				t.Fatalf("record %d is seq %d, want %d", i, got[i], sent[i])
			}
		}
	})
}

// A producer and a consumer on two goroutines with the doorbell: every
// record arrives whole (content checked) and in order.
func TestRingConcurrentDoorbell(t *testing.T) {
	const records = 20000
	mem, err := NewSharedMemory("ringtest", ringLayoutSize(1<<14))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	initRingLayout(mem.Bytes(), 1<<14)
	prod, cons := submissionRing(mem.Bytes(), 1<<14), submissionRing(mem.Bytes(), 1<<14)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for s := uint64(1); s <= records; s++ {
			p := payloadFor(s, int(s%700))
			for {
				err := prod.put(recCompletion, s, p)
				if err == nil {
					break
				}
				if !errors.Is(err, errRingFull) {
					t.Errorf("put: %v", err)
					return
				}
				prod.publish()
				waitRoom(stop)
			}
			if s%3 == 0 {
				prod.publish()
			}
		}
		prod.publish()
	}()
	var buf []byte
	for want := uint64(1); want <= records; {
		cons.wait(stop)
		for {
			kind, s, p, b, ok, err := cons.next(buf)
			buf = b
			if err != nil {
				t.Fatalf("next: %v", err)
			}
			if !ok {
				break
			}
			if s != want || kind != recCompletion || !bytes.Equal(p, payloadFor(s, int(s%700))) {
				t.Fatalf("record %d: got seq %d kind %d len %d (torn or out of order)", want, s, kind, len(p))
			}
			want++
		}
	}
	close(stop)
	wg.Wait()
}

// A producer that lies about its tail, or writes impossible headers, is
// refused with errRingCorrupt and never makes the consumer read outside
// the ring or return a record that was not published whole.
func TestRingRejectsCorruption(t *testing.T) {
	cases := map[string]func(prod *ring, mem []byte){
		"tail-beyond-capacity": func(prod *ring, _ []byte) {
			prod.tail.Store(ringMinCapacity + 16)
		},
		"length-beyond-tail": func(prod *ring, _ []byte) {
			binary.LittleEndian.PutUint32(prod.data[0:], 1000)
			prod.tail.Store(32)
		},
		"length-huge": func(prod *ring, _ []byte) {
			binary.LittleEndian.PutUint32(prod.data[0:], 0xffffffff)
			prod.tail.Store(ringMinCapacity)
		},
		"wrap-at-start": func(prod *ring, _ []byte) {
			putRecordHeader(prod.data, 0, recWrap, 0)
			prod.tail.Store(ringMinCapacity)
		},
		"misaligned-tail": func(prod *ring, _ []byte) { prod.tail.Store(8) },
	}
	t.Run("tail-moved-back", func(t *testing.T) {
		prod, cons, _ := testRings(ringMinCapacity)
		_ = prod.put(recPost, 1, []byte("x"))
		prod.publish()
		if _, _, _, _, ok, err := cons.next(nil); !ok || err != nil {
			t.Fatalf("first record: ok=%v err=%v", ok, err)
		}
		prod.tail.Store(0)
		if _, _, _, _, ok, err := cons.next(nil); ok || !errors.Is(err, errRingCorrupt) {
			t.Fatalf("next: ok=%v err=%v, want errRingCorrupt", ok, err)
		}
	})
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			prod, _, mem := testRings(ringMinCapacity)
			corrupt(prod, mem)
			cons := submissionRing(mem, ringMinCapacity)
			if _, _, _, _, ok, err := cons.next(nil); ok || !errors.Is(err, errRingCorrupt) {
				t.Fatalf("next: ok=%v err=%v, want errRingCorrupt", ok, err)
			}
		})
	}
}

// FuzzRingDecode: whatever a plugin writes into the shared pages (data
// and its tail), the host's decoder never panics, never loops, never
// returns a payload larger than allowed, and stays within the ring.
func FuzzRingDecode(f *testing.F) {
	f.Add([]byte{}, uint64(0))
	f.Add(bytes.Repeat([]byte{0xff}, 64), uint64(64))
	good, _, _ := testRings(ringMinCapacity)
	_ = good.put(recCompletion, 1, []byte("hello"))
	f.Add(append([]byte(nil), good.data[:64]...), good.pos)
	f.Fuzz(func(t *testing.T, data []byte, tail uint64) {
		prod, _, mem := testRings(ringMinCapacity)
		copy(prod.data, data)
		prod.tail.Store(tail)
		cons := submissionRing(mem, ringMinCapacity)
		var buf []byte
		for i := 0; i < ringMinCapacity/ringHeaderSize+2; i++ {
			_, _, p, b, ok, err := cons.next(buf)
			buf = b
			if err != nil || !ok {
				return
			}
			if uint64(len(p)) > cons.maxPayload() || cons.pos > tail {
				t.Fatalf("accepted a record beyond bounds: len %d pos %d tail %d", len(p), cons.pos, tail)
			}
		}
		t.Fatalf("decoder did not stop")
	})
}
