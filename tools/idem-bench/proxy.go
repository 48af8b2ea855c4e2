package main

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// tripProxy is a TCP proxy on loopback that counts round trips: how many
// times a client, having sent bytes, waits for the server to answer. Each
// connection keeps one flag, set when client bytes are forwarded and cleared
// by the first server bytes that follow; every clear is one round trip. A
// pipeline sent in one write and answered in several reads counts once, as it
// costs one wait.
//
// With a delay, the proxy also stands in for a network: every chunk is
// delivered delay after it was read, in each direction, so a round trip
// costs twice the delay more than on loopback.
type tripProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	trips  atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func startProxy(ctx context.Context, target string, delay time.Duration) (*tripProxy, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tripProxy{ln: ln, target: target, delay: delay}
	p.wg.Add(1)
	go p.serve(ctx)
	return p, nil
}

func (p *tripProxy) addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

func (p *tripProxy) serve(ctx context.Context) {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		var d net.Dialer
		s, err := d.DialContext(ctx, "tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var waiting atomic.Bool
		p.wg.Add(2)
		go p.forward(c, s, func() { waiting.Store(true) })
		go p.forward(s, c, func() {
			if waiting.Swap(false) {
				p.trips.Add(1)
			}
		})
	}
}

// forward copies from src to dst, calling seen before writing each chunk so
// that a reply can never be observed before the request that caused it.
func (p *tripProxy) forward(src, dst net.Conn, seen func()) {
	defer p.wg.Done()
	if p.delay > 0 {
		p.forwardLate(src, dst, seen)
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			seen()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil { // EOF or a torn connection: end both directions
			src.Close()
			dst.Close()
			return
		}
	}
}

type chunk struct {
	data []byte
	due  time.Time
}

// forwardLate delivers each chunk delay after it was read, keeping order.
func (p *tripProxy) forwardLate(src, dst net.Conn, seen func()) {
	ch := make(chan chunk, 1024)
	go func() {
		for c := range ch {
			time.Sleep(time.Until(c.due))
			seen()
			if _, err := dst.Write(c.data); err != nil {
				src.Close()
				dst.Close()
			}
		}
	}()
	defer close(ch)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.delay)}
		}
		if err != nil {
			time.Sleep(p.delay)
			src.Close()
			dst.Close()
			return
		}
	}
}

func (p *tripProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
