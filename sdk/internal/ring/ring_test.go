package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"
)

// testRings is a fresh layout with a producer and a consumer view of its
// submission ring, as host and plugin would hold them.
func testRings(capacity uint64) (prod, cons *Ring, mem []byte) {
	mem = make([]byte, LayoutSize(capacity))
	InitLayout(mem, capacity)
	return Submission(mem, capacity), Submission(mem, capacity), mem
}

// sharedMemory is a MAP_SHARED anonymous mapping, unmapped at the test's end.
func sharedMemory(t *testing.T, size uint64) []byte {
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return mem
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
		prod, cons, _ := testRings(MinCapacity)
		var sent, got []uint64
		sizes := map[uint64]int{}
		var seq uint64
		var buf []byte
		for range rapid.IntRange(1, 300).Draw(t, "steps") {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				n := rapid.IntRange(0, int(prod.MaxPayload())).Draw(t, "len")
				seq++
				err := prod.Put(RecPost, seq, payloadFor(seq, n))
				if errors.Is(err, ErrFull) {
					seq--
					continue
				}
				if err != nil {
					t.Fatalf("put: %v", err)
				}
				sizes[seq] = n
				sent = append(sent, seq)
			case 1:
				prod.Publish()
			case 2:
				kind, s, p, b, ok, err := cons.Next(buf)
				buf = b
				if err != nil {
					t.Fatalf("next: %v", err)
				}
				if !ok {
					continue
				}
				if kind != RecPost || !bytes.Equal(p, payloadFor(s, sizes[s])) {
					t.Fatalf("record %d: kind %d, %d bytes, wrong content", s, kind, len(p))
				}
				got = append(got, s)
			}
		}
		prod.Publish()
		for {
			_, s, _, b, ok, err := cons.Next(buf)
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
	mem := sharedMemory(t, LayoutSize(1<<14)) // the futex is the shared (cross-process) kind
	InitLayout(mem, 1<<14)
	prod, cons := Submission(mem, 1<<14), Submission(mem, 1<<14)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for s := uint64(1); s <= records; s++ {
			p := payloadFor(s, int(s%700))
			for {
				err := prod.Put(RecCompletion, s, p)
				if err == nil {
					break
				}
				if !errors.Is(err, ErrFull) {
					t.Errorf("put: %v", err)
					return
				}
				prod.Publish()
				WaitRoom(stop)
			}
			if s%3 == 0 {
				prod.Publish()
			}
		}
		prod.Publish()
	}()
	var buf []byte
	for want := uint64(1); want <= records; {
		cons.Wait(stop)
		for {
			kind, s, p, b, ok, err := cons.Next(buf)
			buf = b
			if err != nil {
				t.Fatalf("next: %v", err)
			}
			if !ok {
				break
			}
			if s != want || kind != RecCompletion || !bytes.Equal(p, payloadFor(s, int(s%700))) {
				t.Fatalf("record %d: got seq %d kind %d len %d (torn or out of order)", want, s, kind, len(p))
			}
			want++
		}
	}
	close(stop)
	wg.Wait()
}

// A producer that lies about its tail, or writes impossible headers, is
// refused with ErrCorrupt and never makes the consumer read outside
// the ring or return a record that was not published whole.
func TestRingRejectsCorruption(t *testing.T) {
	cases := map[string]func(prod *Ring, mem []byte){
		"tail-beyond-capacity": func(prod *Ring, _ []byte) {
			prod.tail.Store(MinCapacity + 16)
		},
		"length-beyond-tail": func(prod *Ring, _ []byte) {
			binary.LittleEndian.PutUint32(prod.data[0:], 1000)
			prod.tail.Store(32)
		},
		"length-huge": func(prod *Ring, _ []byte) {
			binary.LittleEndian.PutUint32(prod.data[0:], 0xffffffff)
			prod.tail.Store(MinCapacity)
		},
		"wrap-at-start": func(prod *Ring, _ []byte) {
			PutRecordHeader(prod.data, 0, recWrap, 0)
			prod.tail.Store(MinCapacity)
		},
		"misaligned-tail": func(prod *Ring, _ []byte) { prod.tail.Store(8) },
	}
	t.Run("tail-moved-back", func(t *testing.T) {
		prod, cons, _ := testRings(MinCapacity)
		_ = prod.Put(RecPost, 1, []byte("x"))
		prod.Publish()
		if _, _, _, _, ok, err := cons.Next(nil); !ok || err != nil {
			t.Fatalf("first record: ok=%v err=%v", ok, err)
		}
		prod.tail.Store(0)
		if _, _, _, _, ok, err := cons.Next(nil); ok || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("next: ok=%v err=%v, want ErrCorrupt", ok, err)
		}
	})
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			prod, _, mem := testRings(MinCapacity)
			corrupt(prod, mem)
			cons := Submission(mem, MinCapacity)
			if _, _, _, _, ok, err := cons.Next(nil); ok || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("next: ok=%v err=%v, want ErrCorrupt", ok, err)
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
	good, _, _ := testRings(MinCapacity)
	_ = good.Put(RecCompletion, 1, []byte("hello"))
	f.Add(append([]byte(nil), good.data[:64]...), good.pos)
	f.Fuzz(func(t *testing.T, data []byte, tail uint64) {
		prod, _, mem := testRings(MinCapacity)
		copy(prod.data, data)
		prod.tail.Store(tail)
		cons := Submission(mem, MinCapacity)
		var buf []byte
		for i := 0; i < MinCapacity/HeaderSize+2; i++ {
			_, _, p, b, ok, err := cons.Next(buf)
			buf = b
			if err != nil || !ok {
				return
			}
			if uint64(len(p)) > cons.MaxPayload() || cons.pos > tail {
				t.Fatalf("accepted a record beyond bounds: len %d pos %d tail %d", len(p), cons.pos, tail)
			}
		}
		t.Fatalf("decoder did not stop")
	})
}

// A consumer that announced its sleep is woken once, however many
// records are published before it runs again: the first Doorbell takes
// the announcement and the rest cost no syscall. Its next sleep gets a
// wake again. (The doorbell that woke on every ring while the sleeper
// had not yet run made as many syscalls as there were publishes.)
func TestDoorbellWakesOncePerSleep(t *testing.T) {
	prod, cons, _ := testRings(MinCapacity)
	for sleep := 1; sleep <= 2; sleep++ {
		cons.sleeping.Store(1) // as Wait does before its futex wait
		for i := 0; i < 10; i++ {
			if err := prod.Put(RecPost, uint64(i), nil); err != nil {
				t.Fatal(err)
			}
			prod.Publish()
		}
		if got := prod.Wakes(); got != uint64(sleep) {
			t.Fatalf("sleep %d: %d wakes for 10 publishes, want %d", sleep, got, sleep)
		}
		if cons.sleeping.Load() != 0 {
			t.Fatal("the sleep announcement was not taken")
		}
		for {
			_, _, _, _, ok, err := cons.Next(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
		}
	}
	prod.Publish() // nobody sleeps: no wake
	if prod.Wakes() != 2 {
		t.Fatalf("a publish to an awake consumer woke it: %d wakes", prod.Wakes())
	}
}
