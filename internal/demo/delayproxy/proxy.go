// Package delayproxy is a TCP proxy that delays the bytes it forwards from
// client to server, so that writes posted before an abort really arrive
// after it (the demo puts it on the data path between prefill and decode).
//
// It owns only byte forwarding and timing. It must never drop, reorder
// within a connection, or alter bytes: the transport's own checks (write
// deadlines, acknowledgements) stay the only judges of what lands.
package delayproxy

import (
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections to Target. Connection k (in accept order) is
// delayed by Delays[k % len(Delays)] one way (client → server); replies pass
// at once. Different delays per connection model several NICs or queue
// pairs with different queueing: writes of different requests overtake each
// other, as they do on real RDMA fabrics.
type Proxy struct {
	Target string
	Delays []time.Duration

	lis  net.Listener
	mu   sync.Mutex
	n    int
	cons []net.Conn
	wg   sync.WaitGroup
}

// Start listens on addr (127.0.0.1:0 style) and returns the proxy address.
func (p *Proxy) Start(addr string) (string, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	p.lis = lis
	go p.accept()
	return lis.Addr().String(), nil
}

func (p *Proxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		delay := time.Duration(0)
		if len(p.Delays) > 0 {
			delay = p.Delays[p.n%len(p.Delays)]
		}
		p.n++
		p.mu.Unlock()
		go p.handle(c, delay)
	}
}

type chunk struct {
	at   time.Time
	data []byte
}

func (p *Proxy) handle(client net.Conn, delay time.Duration) {
	server, err := net.Dial("tcp", p.Target)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	p.cons = append(p.cons, client, server)
	p.mu.Unlock()
	q := make(chan chunk, 1<<16)
	go func() { // client → queue
		defer close(q)
		for {
			buf := make([]byte, 64<<10)
			n, err := client.Read(buf)
			if n > 0 {
				q <- chunk{at: time.Now(), data: buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // queue → server, each chunk no earlier than its delay
		defer func() {
			if tc, ok := server.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}()
		for c := range q {
			if d := time.Until(c.at.Add(delay)); d > 0 {
				time.Sleep(d)
			}
			if _, err := server.Write(c.data); err != nil {
				return
			}
		}
	}()
	_, _ = io.Copy(client, server) // server → client at once
	client.Close()
	server.Close()
}

// Close stops the proxy and cuts every connection.
func (p *Proxy) Close() {
	if p.lis != nil {
		p.lis.Close()
	}
	p.mu.Lock()
	for _, c := range p.cons {
		c.Close()
	}
	p.mu.Unlock()
}
