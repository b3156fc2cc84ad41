package tcp

import (
	"net"
	"sync"
)

// A sending session's writer gathers sealed TLS records while it has more
// batches queued. Records (frame headers, payloads: a TLS record is at
// most 16 KiB of plaintext) are copied aside, up to corkLimit in all; one
// that would pass corkLimit leaves at once with what was gathered in front
// of it, in one vectored write — a 64 KiB batch's four records in one
// system call instead of four. Copying whole records costs less than the
// system calls and wake-ups it saves: 15–25 % less CPU per 64 KiB and
// 1 MiB batch, in process and out (docs/boundary.md); an earlier
// measurement had found the opposite with 8 KiB as the bound.
const (
	corkLimit   = 64 << 10
	corkCopyMax = 16<<10 + 256 // a whole TLS 1.3 record, its overhead included
)

// corkedConn sits between a sending session's TLS layer and its TCP socket.
// The TLS layer seals each record (at most 16 KiB) and writes it out at
// once: a 48-byte frame header became its own record, its own system call
// and its own packet. While corked, records are gathered (copied: the TLS
// layer reuses its record buffer) and leave in one vectored write when the
// next would pass corkLimit or is large, or on flush; uncorked, writes go straight
// through, so a record the TLS layer writes on its own while the writer is
// idle (a key update answer) is never held back. What is gathered is
// ciphertext only: the writer's source memory is no longer read once the
// TLS layer's Write returned. Reads, deadlines and Close are the socket's.
type corkedConn struct {
	net.Conn

	mu      sync.Mutex
	corked  bool
	pending []byte
}

func newCorkedConn(c net.Conn) *corkedConn { return &corkedConn{Conn: c} }

func (c *corkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked && len(c.pending)+len(p) <= corkLimit && len(p) <= corkCopyMax {
		c.pending = append(c.pending, p...)
		return len(p), nil
	}
	if len(c.pending) == 0 {
		return c.Conn.Write(p)
	}
	held := len(c.pending)
	bufs := net.Buffers{c.pending, p}
	n, err := bufs.WriteTo(c.Conn)
	c.pending = c.pending[:0]
	return max(int(n)-held, 0), err
}

// cork starts gathering records.
func (c *corkedConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// flush writes what was gathered and stops gathering.
func (c *corkedConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	if len(c.pending) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.pending)
	c.pending = c.pending[:0]
	return err
}
