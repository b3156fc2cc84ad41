package nocancel

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// The directory is how an initiator learns where a key's window is: the
// backends address remote memory by absolute virtual address in the target
// process, and none of their C APIs lists a peer's buffers. One TCP
// listener per plugin process; a request is a key (8 bytes, little endian);
// the answer is found (1 byte), the window's absolute address and length
// (8 bytes each). Key 0 is the hello: found=1, then the lengths f and m of
// the process's framing text and of its backend metadata (NIXL's agent
// metadata; empty for Mooncake), then those f and m bytes.
//
// It carries no payload and grants nothing the backend enforces: the
// backend lets any peer write any registered address. It exists so that
// honest initiators can bounds-check what they post.

const dirAnswer = 17

type window struct {
	addr uintptr
	n    uint64
}

type directory struct {
	ln       net.Listener
	framing  string
	metadata func() []byte
	lookup   func(sdk.Key) (window, bool)
	wg       sync.WaitGroup
}

// hello is what a peer learns at Connect and again at each new key.
type hello struct {
	framing  string
	metadata []byte
}

func listenDirectory(addr, framing string, metadata func() []byte, lookup func(sdk.Key) (window, bool)) (*directory, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.Unavailable, "directory listen %s: %v", addr, err)
	}
	d := &directory{ln: ln, framing: framing, metadata: metadata, lookup: lookup}
	d.wg.Add(1)
	go d.accept()
	return d, nil
}

func (d *directory) Addr() string { return d.ln.Addr().String() }

func (d *directory) Close() { _ = d.ln.Close(); d.wg.Wait() }

func (d *directory) accept() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		go d.serve(c)
	}
}

func (d *directory) serve(c net.Conn) {
	defer c.Close()
	var req [8]byte
	for {
		if _, err := io.ReadFull(c, req[:]); err != nil {
			return
		}
		key := sdk.Key(binary.LittleEndian.Uint64(req[:]))
		var ans [dirAnswer]byte
		var tail []byte
		if key == 0 {
			md := d.metadata()
			ans[0] = 1
			binary.LittleEndian.PutUint64(ans[1:], uint64(len(d.framing)))
			binary.LittleEndian.PutUint64(ans[9:], uint64(len(md)))
			tail = append([]byte(d.framing), md...)
		} else if w, ok := d.lookup(key); ok {
			ans[0] = 1
			binary.LittleEndian.PutUint64(ans[1:], uint64(w.addr))
			binary.LittleEndian.PutUint64(ans[9:], w.n)
		}
		if _, err := c.Write(append(ans[:], tail...)); err != nil {
			return
		}
	}
}

// dirClient asks one peer's directory; one request at a time. A failed
// exchange closes its connection (c is then nil) and the next one redials:
// after a timeout the late answer would otherwise be read as the answer to
// the next key, a window the request never named; and after a transient
// link error (measured under netem: "no route to host") every later key
// would be refused for good.
type dirClient struct {
	mu   sync.Mutex
	addr string
	c    net.Conn
}

// dirTimeout bounds a lookup: Post waits at most this long for a key's
// first use (then refuses, Unavailable, having sent nothing).
const dirTimeout = 2 * time.Second

// maxMetadata bounds a peer's hello (NIXL metadata is a few KiB).
const maxMetadata = 16 << 20

func dialDirectory(addr string) (*dirClient, hello, error) {
	c, err := net.DialTimeout("tcp", addr, dirTimeout)
	if err != nil {
		return nil, hello{}, errdefs.Errorf(errdefs.Unavailable, "peer directory %s: %v", addr, err)
	}
	dc := &dirClient{addr: addr, c: c}
	h, err := dc.hello()
	if err != nil {
		dc.Close()
		return nil, h, err
	}
	return dc, h, nil
}

func (dc *dirClient) hello() (hello, error) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	found, f, m, err := dc.ask(0)
	if err != nil || !found || f > 64 || m > maxMetadata {
		return hello{}, errdefs.Errorf(errdefs.Unavailable, "peer directory: bad hello (%v)", err)
	}
	buf := make([]byte, uint64(f)+m)
	if _, err := io.ReadFull(dc.c, buf); err != nil {
		dc.drop()
		return hello{}, errdefs.Errorf(errdefs.Unavailable, "peer directory: %v", err)
	}
	return hello{framing: string(buf[:f]), metadata: buf[f:]}, nil
}

func (dc *dirClient) ask(key sdk.Key) (found bool, addr uintptr, n uint64, err error) {
	if dc.c == nil {
		if dc.c, err = net.DialTimeout("tcp", dc.addr, dirTimeout); err != nil {
			dc.c = nil
			return
		}
	}
	defer func() {
		if err != nil {
			dc.drop()
		}
	}()
	_ = dc.c.SetDeadline(time.Now().Add(dirTimeout))
	var req [8]byte
	binary.LittleEndian.PutUint64(req[:], uint64(key))
	if _, err = dc.c.Write(req[:]); err != nil {
		return
	}
	var ans [dirAnswer]byte
	if _, err = io.ReadFull(dc.c, ans[:]); err != nil {
		return
	}
	return ans[0] == 1, uintptr(binary.LittleEndian.Uint64(ans[1:])), binary.LittleEndian.Uint64(ans[9:]), nil
}

// resolve looks a key up; NotFound when the peer does not know it. A
// lookup that fails on a connection kept from earlier is asked once more on
// a fresh one: a link fault since lifted (a blackhole's TCP timeout, a
// socket the kernel aborted) leaves the kept connection dead, and without
// the retry the first Post on the healthy link after it failed (measured
// across two hosts against real Mooncake). A lookup moves no payload, so
// asking twice is harmless.
func (dc *dirClient) resolve(key sdk.Key) (window, error) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	kept := dc.c != nil
	found, addr, n, err := dc.ask(key)
	if err != nil && kept {
		found, addr, n, err = dc.ask(key)
	}
	if err != nil {
		return window{}, errdefs.Errorf(errdefs.Unavailable, "peer directory: %v", err)
	}
	if !found {
		return window{}, errdefs.Errorf(errdefs.NotFound, "key %#x unknown at the peer", uint64(key))
	}
	return window{addr, n}, nil
}

// drop closes the connection after a failed exchange; the next redials.
func (dc *dirClient) drop() {
	if dc.c != nil {
		_ = dc.c.Close()
		dc.c = nil
	}
}

func (dc *dirClient) Close() {
	if dc != nil {
		dc.mu.Lock()
		dc.drop()
		dc.mu.Unlock()
	}
}
