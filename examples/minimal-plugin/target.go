package main

import (
	"bufio"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// exposure is a granted window. Every apply holds mu for reading; Revoke
// takes it for writing, so when Revoke returns no apply is under way and
// none will start.
type exposure struct {
	mu               sync.RWMutex
	r                *region
	off, n           uint64
	revoked          bool // under mu
	applied, refused atomic.Uint64
}

func (t *transport) accept() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			return
		}
		t.conns[c] = true
		t.mu.Unlock()
		go t.serve(c)
	}
}

// serve applies the frames of one connection in order.
func (t *transport) serve(c net.Conn) {
	defer func() {
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, 256<<10)
	for {
		h, ok, err := readHeader(r)
		if err != nil || !ok || h.n == 0 || h.n > maxOpBytes {
			return // closed, or a corrupted stream
		}
		buf := make([]byte, h.n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		if _, err := c.Write([]byte{t.apply(h, buf)}); err != nil {
			return
		}
	}
}

// apply copies one frame into its window, unless the key is unknown or
// revoked, the range is outside the window, or the deadline has passed.
func (t *transport) apply(h header, buf []byte) byte {
	t.mu.Lock()
	e := t.keys[sdk.Key(h.key)]
	t.mu.Unlock()
	if e == nil {
		// One answer for unknown and revoked keys: a guesser must not
		// learn which keys ever existed.
		return replyRevoked
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	switch {
	case e.revoked:
		e.refused.Add(1)
		return replyRevoked
	case h.n > e.n || h.off > e.n-h.n:
		e.refused.Add(1)
		return replyOutWindow
	case time.Now().UnixNano() > h.deadline:
		return replyExpired
	}
	copy(e.r.mem[e.off+h.off:], buf)
	e.applied.Add(1)
	return replyApplied
}
