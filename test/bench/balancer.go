// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// balancer is a TCP load balancer in this process in front of dkc-server's replicas, as a Service's virtual
// IP with kube-proxy (IPVS, or iptables once the dead endpoint is gone) is to the nodes: each new connection
// goes to the next backend round-robin, and a backend that refuses it is skipped. It forwards bytes only: TLS
// is between the node and the replica, whose certificate names the balancer's loopback address too.
type balancer struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint64
	// forwarded counts the connections each backend took, open the ones still open.
	forwarded, open []atomic.Int64

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// balancerDialTimeout bounds the dial of one backend: a refused one fails at once on this machine, one that
// hangs (SIGSTOP) is skipped after this.
const balancerDialTimeout = 2 * time.Second

// balancerBuffer is each direction's copy buffer. io.Copy between TCP connections would splice, holding a
// pipe (two descriptors) per direction while it waits, and 10,000 connections cannot afford 40,000 more
// descriptors; 4 KiB per direction is 80 MiB at 10,000, against io.Copy's 32 KiB.
const balancerBuffer = 4 << 10

// newBalancer listens on addr (e.g. 127.0.0.1:0) and forwards to backends until Close.
func newBalancer(addr string, backends ...string) (*balancer, error) {
	if len(backends) == 0 {
		return nil, errors.New("a balancer needs a backend")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &balancer{ln: ln, backends: backends, forwarded: make([]atomic.Int64, len(backends)),
		open: make([]atomic.Int64, len(backends)), conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.serve()
	return b, nil
}

// Addr is the balancer's host:port.
func (b *balancer) Addr() string { return b.ln.Addr().String() }

// Forwarded is how many connections backend i has taken, and how many of them are still open.
func (b *balancer) Forwarded(i int) (total, open int64) {
	return b.forwarded[i].Load(), b.open[i].Load()
}

// Close stops accepting, closes every forwarded connection and waits for the copies to end.
func (b *balancer) Close() error {
	b.mu.Lock()
	b.closed = true
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	err := b.ln.Close()
	b.wg.Wait()
	return err
}

func (b *balancer) serve() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: the node retries, as it would a full conntrack table.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !b.track(c) {
			c.Close()
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer b.untrack(c)
			b.forward(c)
		}()
	}
}

// track records c so that Close closes it; false once closed.
func (b *balancer) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *balancer) untrack(c net.Conn) {
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
	c.Close()
}

// forward connects c to the next backend that accepts and copies both ways until either side ends; then
// both are closed, as a proxy must so that the other end sees the connection gone. No backend: c is closed.
func (b *balancer) forward(c net.Conn) {
	first := b.next.Add(1) - 1
	var d net.Conn
	i := 0
	for k := range len(b.backends) {
		i = int((first + uint64(k)) % uint64(len(b.backends)))
		var err error
		if d, err = net.DialTimeout("tcp", b.backends[i], balancerDialTimeout); err == nil {
			break
		}
	}
	if d == nil || !b.track(d) {
		if d != nil {
			d.Close()
		}
		return
	}
	defer b.untrack(d)
	b.forwarded[i].Add(1)
	b.open[i].Add(1)
	defer b.open[i].Add(-1)
	done := make(chan struct{}, 2)
	// The wrappers hide ReadFrom and WriteTo, so that the copy uses the buffer instead of splice.
	pipe := func(dst, src net.Conn) {
		_, _ = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, balancerBuffer))
		done <- struct{}{}
	}
	go pipe(d, c)
	go pipe(c, d)
	<-done
	c.Close()
	d.Close()
	<-done
}
