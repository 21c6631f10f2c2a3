package server

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// connScale sizes the gRPC listener's connection cap to the Node count (--max-connections 0): one
// connection per node — each sidecar holds exactly one, and one replica must be able to hold every node
// while the other is drained — plus a tenth for what is briefly doubled (a sidecar that reconnected while
// the server has not yet found its old connection dead: up to --keepalive-time + --keepalive-timeout) and
// for tools (grpcurl). What a flood can hold is the cap less the nodes this replica serves, at up to
// ~220 KB each before auth (TestUnauthenticatedFloodIsBounded): the slack when it serves every node, but
// more than the Deployment's memory limit covers when two replicas share a large fleet — a separate cap on
// unauthenticated connections is still to do (docs/security.md, "Unauthenticated callers"). The floor keeps
// a small cluster's cap out of the way of tests and tools.
const (
	connFloor   = 1024
	connPerNode = 1.1
)

// connCap is the cap for n Nodes.
func connCap(n int) int { return max(connFloor, int(connPerNode*float64(n))) }

// connLimiter is a net.Listener that holds at most limit accepted connections open at once. A connection
// past the cap is accepted and closed at once rather than left in the kernel's backlog (what
// golang.org/x/net/netutil.LimitListener does): the client sees the refusal immediately and backs off — a
// sidecar retries within 3 s — and a flood of connections costs the kernel's accept queue nothing. Every
// connection counts from accept to close, whether it ever completes a TLS handshake or authenticates:
// what it costs dkc-server before auth is bounded by the handshake timeout, the idle timeout, the header
// and message caps, and this count.
type connLimiter struct {
	net.Listener
	limit    atomic.Int64
	open     atomic.Int64
	refused  prometheus.Counter
	fixedCap bool // --max-connections set: the Node count does not resize it
}

func newConnLimiter(l net.Listener, limit int, reg prometheus.Registerer) *connLimiter {
	c := &connLimiter{Listener: l, fixedCap: limit > 0,
		refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server", Name: "connections_refused_total",
			Help: "gRPC connections closed at accept because --max-connections were open."})}
	if limit <= 0 {
		limit = connCap(0)
	}
	c.limit.Store(int64(limit))
	if reg != nil {
		reg.MustRegister(c.refused,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "connections",
				Help: "gRPC connections open (accepted, authenticated or not)."}, func() float64 { return float64(c.open.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "max_connections",
				Help: "The cap on open gRPC connections (--max-connections, or sized to the Node count)."}, func() float64 { return float64(c.limit.Load()) }))
	}
	return c
}

// Accept returns the next connection within the cap, closing those past it.
func (c *connLimiter) Accept() (net.Conn, error) {
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c.open.Add(1) > c.limit.Load() {
			c.open.Add(-1)
			c.refused.Inc()
			_ = conn.Close()
			continue
		}
		return &countedConn{Conn: conn, release: func() { c.open.Add(-1) }}, nil
	}
}

// follow resizes the cap every interval from the Node cache, until ctx ends; a fixed cap stays.
func (c *connLimiter) follow(ctx context.Context, nodes corelisters.NodeLister, interval time.Duration) {
	if c.fixedCap {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c.resize(nodes)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resize sizes the cap to the Node cache now (a fixed cap stays). Run calls it once the cache is synced,
// before the replica reports SERVING: sidecars that reconnect to a new replica together are refused only
// while its cache syncs.
func (c *connLimiter) resize(nodes corelisters.NodeLister) {
	if c.fixedCap {
		return
	}
	if list, err := nodes.List(labels.Everything()); err == nil {
		c.limit.Store(int64(connCap(len(list))))
	}
}

// countedConn gives its place back once, on the first Close.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
