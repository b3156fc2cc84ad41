package tcp

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// recordingConn records what reaches the socket, one entry per write.
type recordingConn struct {
	net.Conn
	writes [][]byte
}

func (r *recordingConn) Write(p []byte) (int, error) {
	r.writes = append(r.writes, append([]byte(nil), p...))
	return len(p), nil
}

func (r *recordingConn) sent() []byte { return bytes.Join(r.writes, nil) }

// The cork holds records only while corked, keeps their order, lets one
// larger than any TLS record out at once with what it held in front, and
// holds nothing
// after a flush or while uncorked (a record the TLS layer writes on its own
// while the writer is idle must not wait for the next batch).
func TestCorkGathersInOrder(t *testing.T) {
	rec := &recordingConn{}
	c := newCorkedConn(rec)
	small := func(b byte) []byte { return bytes.Repeat([]byte{b}, 70) }
	if _, err := c.Write(small('u')); err != nil || len(rec.writes) != 1 {
		t.Fatalf("uncorked write held back: %d writes, %v", len(rec.writes), err)
	}
	c.cork()
	c.Write(small('a'))
	c.Write(small('b'))
	if len(rec.writes) != 1 {
		t.Fatalf("corked small records left early: %d writes", len(rec.writes))
	}
	big := bytes.Repeat([]byte{'B'}, corkCopyMax+1)
	if n, err := c.Write(big); err != nil || n != len(big) {
		t.Fatalf("large record: n=%d, %v", n, err)
	}
	want := append(append(append(small('u'), small('a')...), small('b')...), big...)
	if !bytes.Equal(rec.sent(), want) {
		t.Fatal("a large record did not leave at once behind the held ones")
	}
	c.Write(small('c'))
	for i := 0; i < corkLimit/70+1; i++ { // past corkLimit: leaves without a flush
		c.Write(small('d'))
	}
	if len(c.pending) > corkLimit {
		t.Fatalf("cork holds %d bytes, limit %d", len(c.pending), corkLimit)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	want = append(want, small('c')...)
	want = append(want, bytes.Repeat([]byte{'d'}, 70*(corkLimit/70+1))...)
	if !bytes.Equal(rec.sent(), want) || len(c.pending) != 0 {
		t.Fatal("flush lost or reordered records")
	}
	before := len(rec.writes)
	c.Write(small('e'))
	if len(rec.writes) != before+1 {
		t.Fatal("a write after flush was held back")
	}
}

// A 64 KiB batch's four full TLS records leave in one vectored write: the
// first three are held while corked, the fourth, which would pass
// corkLimit, takes them out with it.
func TestCorkGathersWholeRecords(t *testing.T) {
	rec := &recordingConn{}
	c := newCorkedConn(rec)
	c.cork()
	var want []byte
	for i := range 4 {
		r := bytes.Repeat([]byte{byte('0' + i)}, 16<<10+22) // a full TLS 1.3 record
		want = append(want, r...)
		if _, err := c.Write(r); err != nil {
			t.Fatal(err)
		}
		if i < 3 && len(rec.writes) != 0 {
			t.Fatalf("record %d left before the cork was full: %d writes", i, len(rec.writes))
		}
	}
	if !bytes.Equal(rec.sent(), want) || len(c.pending) != 0 {
		t.Fatalf("the fourth record did not take the three held ones out in order (%d bytes sent, %d held)", len(rec.sent()), len(c.pending))
	}
}

// A sender that never reads its acknowledgements cannot make a receiving
// session queue them without bound: past ackBacklog, push waits; when the
// write finally fails, push fails and the session is aborted.
func TestAckBacklogIsBounded(t *testing.T) {
	local, remote := net.Pipe() // remote never reads: every write blocks
	s := &recvSession{raw: local, conn: local, done: make(chan struct{})}
	a := startAckWriter(s)
	pushed := make(chan int, 1)
	errc := make(chan error, 1)
	go func() {
		n := 0
		for {
			if err := a.push(header{Type: frameAck, Seq: uint64(n)}); err != nil {
				pushed <- n
				errc <- err
				return
			}
			n++
		}
	}()
	time.Sleep(200 * time.Millisecond)
	a.mu.Lock()
	held := len(a.buf)
	a.mu.Unlock()
	if held > ackBacklog {
		t.Fatalf("%d bytes of acknowledgements queued, bound %d", held, ackBacklog)
	}
	select {
	case n := <-pushed:
		t.Fatalf("push returned after %d acknowledgements with nothing read", n)
	default:
	}
	_ = remote.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("push did not fail")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("push still blocked after the connection broke")
	}
	a.end()
	if !s.dead.Load() {
		t.Fatal("a failed acknowledgement write did not abort the session")
	}
}

// A sender that never asks for its acknowledgements (writeAckNow) still
// gets them: the receiver holds at most ackHoldCount of them, and never
// more than ackHoldBytes of writes' worth. Without either bound these
// batches would wait for acknowledgements that never leave, and end
// InDoubt at their ack timeout.
func TestHeldAcksAreBounded(t *testing.T) {
	mark := markAckNow
	markAckNow = func(bool, bool) bool { return false }
	t.Cleanup(func() { markAckNow = mark })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, k := grantedEnv(ctx, t, sdktest.Pair{Sender: newTCP(t, Config{}), Receiver: newTCP(t, Config{})})
	for _, run := range []struct {
		count int
		size  uint64
	}{
		{ackHoldCount, 4 << 10},               // fills the hold by count
		{ackHoldBytes / (64 << 10), 64 << 10}, // by bytes
	} {
		ids := make([]sdk.BatchID, run.count)
		for i := range ids {
			ids[i] = e.NewBatchID()
			off := uint64(i) * run.size % sdktest.EnvSize
			if err := e.Sender.Post(ctx, e.Write(ids[i], k, off, off, run.size)); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range ids {
			if c, err := e.Wait(id); err != nil || c.Status != sdk.Succeeded {
				t.Fatalf("%d writes of %d bytes, none asking for its acknowledgement: %+v, %v", run.count, run.size, c, err)
			}
		}
	}
}

// grantedEnv is an sdktest environment over pair with a key granted over
// the whole destination.
func grantedEnv(ctx context.Context, t *testing.T, pair sdktest.Pair) (*sdktest.Env, sdk.Key) {
	t.Helper()
	e, err := sdktest.NewEnv(ctx, pair)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	k, err := e.Granter.Grant(ctx, sdk.Window{Region: e.DstID, Length: sdktest.EnvSize})
	if err != nil {
		t.Fatal(err)
	}
	return e, k
}
