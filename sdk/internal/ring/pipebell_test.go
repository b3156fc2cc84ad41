package ring

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pipedRings is a fresh layout's submission ring with a pipe doorbell:
// the producer's view rings it, the consumer's sleeps on it (opened by
// its /proc path, as the plugin does). Sleeps are bounded by an hour, so
// a Wait that returns was woken, not timed out.
func pipedRings(t *testing.T) (prod, cons *Ring, wait *os.File) {
	t.Helper()
	rd, wr, path, err := Pipe()
	if err != nil {
		t.Fatal(err)
	}
	wait, err = OpenPipe(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rd.Close(); _ = wr.Close(); _ = wait.Close() })
	mem := sharedMemory(t, LayoutSize(MinCapacity))
	InitLayout(mem, MinCapacity)
	prod, cons = Submission(mem, MinCapacity), Submission(mem, MinCapacity)
	if err := prod.UsePipe(nil, wr); err != nil {
		t.Fatal(err)
	}
	if err := cons.UsePipe(wait, wait); err != nil {
		t.Fatal(err)
	}
	cons.SleepFor(time.Hour)
	return prod, cons, wait
}

// returnsWithin runs f and fails the test if it has not returned after
// a generous bound (the step it checks takes microseconds).
func returnsWithin(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return: the doorbell did not wake or blocked", what)
	}
}

// pendingBytes is how many wake-up bytes wait in the pipe, read without
// blocking (through the raw descriptor: an os.File Read would park).
func pendingBytes(t *testing.T, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	_ = rc.Read(func(fd uintptr) bool {
		var b [256]byte
		for {
			k, err := unix.Read(int(fd), b[:])
			if k <= 0 || err != nil {
				return true
			}
			n += k
		}
	})
	return n
}

// A consumer asleep on the pipe is woken by the producer's publish, and
// by its own Interrupt; without either it stays asleep (the hour-long
// bound). Ten publishes to one sleep write one byte: one wake-up.
func TestPipeBellWakesOncePerSleep(t *testing.T) {
	prod, cons, wait := pipedRings(t)
	stop := make(chan struct{})
	for sleep := 1; sleep <= 2; sleep++ {
		woke := make(chan struct{})
		go func() { defer close(woke); cons.Wait(stop) }()
		for cons.sleeping.Load() == 0 { // until it announced its sleep
			time.Sleep(time.Millisecond)
		}
		for i := 0; i < 10; i++ {
			if err := prod.Put(RecPost, uint64(i), nil); err != nil {
				t.Fatal(err)
			}
			prod.Publish()
		}
		returnsWithin(t, "Wait", func() { <-woke })
		if got := prod.Wakes(); got != uint64(sleep) {
			t.Fatalf("sleep %d: %d wakes for 10 publishes, want %d", sleep, got, sleep)
		}
		for {
			if _, _, _, _, ok, err := cons.Next(nil); err != nil || !ok {
				break
			}
		}
	}
	if n := pendingBytes(t, wait); n != 0 {
		t.Fatalf("%d wake-up bytes left over", n)
	}
	returnsWithin(t, "Wait after Interrupt", func() {
		go func() {
			for cons.sleeping.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			cons.Interrupt()
		}()
		cons.Wait(stop)
	})
}

// A doorbell never blocks its producer, even on a pipe the consumer
// never drains (a plugin that stops reading, or announces sleeps it
// never takes): the host's Post must not hang on its plugin.
func TestPipeBellNeverBlocksTheProducer(t *testing.T) {
	prod, cons, wait := pipedRings(t)
	rc, err := wait.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	full := false
	_ = rc.Write(func(fd uintptr) bool {
		b := make([]byte, 4096)
		for {
			if _, err := unix.Write(int(fd), b); errors.Is(err, unix.EAGAIN) {
				full = true
				return true
			} else if err != nil {
				return true
			}
		}
	})
	if !full {
		t.Fatal("could not fill the pipe")
	}
	returnsWithin(t, "Doorbell on a full pipe", func() {
		for i := 0; i < 100; i++ {
			cons.AnnounceSleep()
			prod.Publish()
		}
	})
	if prod.Wakes() != 100 {
		t.Fatalf("%d wakes, want 100", prod.Wakes())
	}
}

// Only a pipe is taken as a doorbell: a file that reads at once would
// make every sleep a busy loop.
func TestOpenPipeRefusesOtherFiles(t *testing.T) {
	regular := t.TempDir() + "/file"
	if err := os.WriteFile(regular, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", regular} {
		if f, err := OpenPipe(path); err == nil {
			_ = f.Close()
			t.Errorf("%s was taken as a doorbell pipe", path)
		}
	}
}
