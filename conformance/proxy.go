package conformance

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Proxy is an in-path TCP proxy on loopback that injects real link faults
// between initiator and target, without the plugin's cooperation: Delay
// (every chunk waits), Stall (existing connections stop moving bytes in both
// directions; bytes wait in the proxy and in the kernels' buffers),
// Drop (existing connections silently lose what the initiator sends) and
// Reset (existing connections are torn down with RST). New connections are
// not affected by Stall and Drop, as a stuck queue pair does not stop a new
// one: this lets a plugin's control path (Quiesce) reach the target.
type Proxy struct {
	ln     net.Listener
	target string
	sent   atomic.Uint64 // bytes forwarded from the initiator to the target
	// entered counts bytes read from the initiator, forwarded or not (a
	// dropped or stalled byte entered the fault): the reached guard.
	entered atomic.Uint64

	mu    sync.Mutex
	cond  *sync.Cond
	delay time.Duration
	links map[*link]struct{}
	done  bool
	wg    sync.WaitGroup
	// stallPeak is the most bytes seen waiting, unread, in the stalled
	// connections' receive queues since the last Stall; sampling stops
	// when stallStop is closed (Release, Close).
	stallPeak uint64
	stallStop chan struct{}
}

type link struct {
	a, b    net.Conn // a: from the initiator, b: to the target
	stalled bool
	drop    bool
	closed  bool
	ended   int // directions that saw an orderly end of stream
}

// NewProxy listens on 127.0.0.1 and forwards every connection to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address to dial instead of the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		a, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = a.Close()
			continue
		}
		l := &link{a: a, b: b}
		p.mu.Lock()
		if p.done {
			p.mu.Unlock()
			_, _ = a.Close(), b.Close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, a, b, true)
		go p.pump(l, b, a, false)
	}
}

// pump copies src to dst chunk by chunk, obeying the faults set at the time
// each chunk is forwarded. An end of stream is passed on as a half-close
// (as TCP does: one side may stop sending while the other still sends);
// any other error ends the whole link.
func (p *Proxy) pump(l *link, src, dst net.Conn, toTarget bool) {
	defer p.wg.Done()
	orderly := false
	defer func() {
		if orderly && p.halfClose(l, dst) {
			return
		}
		p.closeLink(l)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && toTarget {
			p.entered.Add(uint64(n))
		}
		if n > 0 {
			p.mu.Lock()
			for l.stalled && !l.closed {
				p.cond.Wait()
			}
			closed, drop, delay := l.closed, l.drop && toTarget, p.delay
			p.mu.Unlock()
			if closed {
				return
			}
			if delay > 0 {
				time.Sleep(delay)
			}
			if !drop {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
				if toTarget {
					p.sent.Add(uint64(n))
				}
			}
		}
		if err != nil {
			orderly = err == io.EOF
			return
		}
	}
}

// halfClose passes an end of stream on to dst; it reports false when both
// directions have ended (the link is then closed).
func (p *Proxy) halfClose(l *link, dst net.Conn) bool {
	p.mu.Lock()
	l.ended++
	both := l.ended == 2 || l.closed
	p.mu.Unlock()
	if both {
		return false
	}
	if tc, ok := dst.(*net.TCPConn); ok && tc.CloseWrite() == nil {
		return true
	}
	return false
}

func (p *Proxy) closeLink(l *link) {
	p.mu.Lock()
	if !l.closed {
		l.closed = true
		delete(p.links, l)
		p.cond.Broadcast()
	}
	p.mu.Unlock()
	_, _ = l.a.Close(), l.b.Close()
}

// SetDelay delays every forwarded chunk by d (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Stall freezes every existing connection until Release; it returns how
// many it froze (0: the fault hit nothing). While it holds, the bytes
// waiting in the frozen connections' receive queues are sampled
// (StallPeak): a stalled pump reads once and then holds, so what a writer
// pushed into the stall is mostly there, not in Entered.
func (p *Proxy) Stall() int {
	n := p.each(func(l *link) { l.stalled = true })
	p.mu.Lock()
	p.stallPeak = 0
	if p.stallStop == nil {
		p.stallStop = make(chan struct{})
		go p.sampleStalled(p.stallStop)
	}
	p.mu.Unlock()
	return n
}

// sampleStalled records the peak of unread bytes queued on the stalled
// connections, every millisecond until stop is closed. A writer that then
// gives up and resets its connection takes those bytes with it; the peak
// stays.
func (p *Proxy) sampleStalled(stop <-chan struct{}) {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		var q uint64
		for l := range p.links {
			if l.stalled && !l.closed {
				q += queued(l.a)
			}
		}
		p.stallPeak = max(p.stallPeak, q)
		p.mu.Unlock()
	}
}

// queued is how many received bytes wait unread on c (SIOCINQ; 0 if it
// cannot be read).
func queued(c net.Conn) uint64 {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	var n int
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return uint64(max(n, 0))
}

// StallPeak is the most bytes seen queued, unread, in the stalled
// connections since the last Stall.
func (p *Proxy) StallPeak() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stallPeak
}

// stopSampling ends the stall's sampler (p.mu held).
func (p *Proxy) stopSampling() {
	if p.stallStop != nil {
		close(p.stallStop)
		p.stallStop = nil
	}
}

// Drop makes every existing connection lose what the initiator sends; it
// returns how many it affects.
func (p *Proxy) Drop() int { return p.each(func(l *link) { l.drop = true }) }

// Release ends Stall and Drop on every connection.
func (p *Proxy) Release() {
	p.each(func(l *link) { l.stalled, l.drop = false, false })
	p.mu.Lock()
	p.stopSampling()
	p.mu.Unlock()
}

func (p *Proxy) each(f func(*link)) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		f(l)
	}
	p.cond.Broadcast()
	return len(p.links)
}

// Reset tears every existing connection down with a RST on both sides and
// returns how many it tore down.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		for _, c := range []net.Conn{l.a, l.b} {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
		}
		p.closeLink(l)
	}
	return len(ls)
}

// Sent is how many bytes the proxy has forwarded from the initiator to the
// target so far: what a write that took the proxied link must add to.
func (p *Proxy) Sent() uint64 { return p.sent.Load() }

// Entered is how many bytes the proxy has read from the initiator, whether
// it forwarded them or its fault swallowed them.
func (p *Proxy) Entered() uint64 { return p.entered.Load() }

// Links is how many connections pass through the proxy now.
func (p *Proxy) Links() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.done = true
	p.stopSampling()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Reset()
	p.wg.Wait()
}
