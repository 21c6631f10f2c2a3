// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// connScale sizes the gRPC listener's connection cap to the Node count (--max-connections 0): one
// connection per node — each sidecar holds exactly one, and one replica must be able to hold every node
// while the other is drained — plus a tenth for what is briefly doubled (a sidecar that reconnected while
// the server has not yet found its old connection dead: up to --keepalive-time + --keepalive-timeout) and
// for tools (grpcurl). The floor keeps a small cluster's cap out of the way of tests and tools. What callers
// without a valid token can hold is capped apart (--max-unauthenticated-connections), whatever the Node
// count: the slack of this cap grows with the fleet, what a flood may cost must not.
const (
	connFloor   = 1024
	connPerNode = 1.1
)

// connCap is the cap for n Nodes.
func connCap(n int) int { return max(connFloor, int(connPerNode*float64(n))) }

// connLimiter bounds the gRPC listener's connections: at most limit open at once, and at most unauthLimit
// of them not yet authenticated, each for at most authTimeout. A connection past a cap is accepted and
// closed at once rather than left in the kernel's backlog (what golang.org/x/net/netutil.LimitListener
// does): the client sees the refusal immediately and backs off — a sidecar retries within 3 s — and a
// flood of connections costs the kernel's accept queue nothing. Every connection counts from accept to
// close, whether it ever completes a TLS handshake or not; it stops counting as unauthenticated at its
// first call a token authenticated (authenticated, called from the auth interceptor). What a connection
// costs before that is bounded by the handshake timeout, the header and message caps, the calls per
// connection, and these counts (TestUnauthenticatedFloodIsBounded).
//
// A valid token does not lift every bound: what one caller can hold must not depend on which token it
// copied. Each IP address may open new connections at a rate (accepts: refused before the TLS handshake,
// so a connect/close loop costs no handshakes past it) and hold a number of them, authenticated or not
// (perAddressAll); each node a number of authenticated connections (perNode), so that one node's token,
// cached and valid, cannot fill limit and lock every other node out.
type connLimiter struct {
	limit         atomic.Int64
	open          atomic.Int64
	unauthLimit   int64 // 0: only limit
	unauth        atomic.Int64
	perAddress    int           // unauthenticated connections from one IP address; 0: no limit of its own
	perAddressAll int           // connections from one IP address, authenticated or not; 0: no limit
	perNode       int           // authenticated connections of one node; 0: no limit
	accepts       *keyedLimiter // new connections per IP address; nil: no limit
	authTimeout   time.Duration // 0: none
	userTimeout   time.Duration // TCP_USER_TIMEOUT of accepted connections; 0: the kernel's
	fixedCap      bool          // --max-connections set: the Node count does not resize it

	refused       prometheus.Counter
	unauthRefused prometheus.Counter
	unauthExpired prometheus.Counter
	addrRefused   prometheus.Counter
	rateRefused   prometheus.Counter
	nodeRefused   prometheus.Counter

	mu        sync.Mutex
	conns     map[string]*countedConn // by both ends' addresses: what a gRPC call's peer names
	byAddr    map[string]int          // unauthenticated connections per remote IP address
	byAddrAll map[string]int          // connections per remote IP address
	byNode    map[string]int          // authenticated connections per node
}

// connLimits are a connLimiter's settings (dkc-server's flags).
type connLimits struct {
	max, maxUnauthenticated, maxUnauthenticatedPerAddress int
	maxPerAddress, maxPerNode                             int
	newPerAddressQPS                                      float64
	newPerAddressBurst                                    int
	authTimeout                                           time.Duration
	// tcpUserTimeout is what grpc-go would set on an unwrapped connection: the keepalive timeout (0: none).
	tcpUserTimeout time.Duration
}

func newConnLimiter(lim connLimits, reg prometheus.Registerer) *connLimiter {
	c := &connLimiter{fixedCap: lim.max > 0,
		unauthLimit: int64(lim.maxUnauthenticated), perAddress: lim.maxUnauthenticatedPerAddress,
		perAddressAll: lim.maxPerAddress, perNode: lim.maxPerNode, accepts: newKeyedLimiter(lim.newPerAddressQPS,
			lim.newPerAddressBurst),
		authTimeout: lim.authTimeout, userTimeout: lim.tcpUserTimeout,
		conns: map[string]*countedConn{}, byAddr: map[string]int{}, byAddrAll: map[string]int{}, byNode: map[string]int{},
		refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "connections_refused_total", Help: "gRPC connections closed at accept because --max-connections were open."}),
		unauthRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "unauthenticated_connections_refused_total",
			Help: "gRPC connections closed at accept because --max-unauthenticated-connections (in all, or from the caller's " +
				"address: --max-unauthenticated-connections-per-address) were open and not yet authenticated."}),
		unauthExpired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "unauthenticated_connections_expired_total",
			Help: "gRPC connections closed because no call on them was authenticated within --authentication-timeout."}),
		addrRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "address_connections_refused_total",
			Help: "gRPC connections closed at accept because the caller's IP address held " +
				"--max-connections-per-address, authenticated or not."}),
		rateRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "connections_rate_limited_total",
			Help: "gRPC connections closed at accept, before their TLS handshake, because the caller's IP address opened new " +
				"connections faster than --new-connections-per-address-qps (burst --new-connections-per-address-burst)."}),
		nodeRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "node_connections_refused_total",
			Help: "Calls refused with ResourceExhausted because their node already held --max-connections-per-node " +
				"authenticated connections to this replica; the refused call's connection stays unauthenticated."}),
	}
	limit := lim.max
	if limit <= 0 {
		limit = connCap(0)
	}
	c.limit.Store(int64(limit))
	if reg != nil {
		reg.MustRegister(c.refused, c.unauthRefused, c.unauthExpired, c.addrRefused, c.rateRefused, c.nodeRefused,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "connections",
				Help: "gRPC connections open (accepted, authenticated or not)."}, func() float64 { return float64(c.open.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server",
				Name: "unauthenticated_connections",
				Help: "gRPC connections open on which no call has been authenticated yet."},
				func() float64 { return float64(c.unauth.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "server", Name: "max_connections",
				Help: "The cap on open gRPC connections (--max-connections, or sized to the Node count)."},
				func() float64 { return float64(c.limit.Load()) }))
	}
	return c
}

// wrap returns l with the limits applied to the connections it accepts.
func (c *connLimiter) wrap(l net.Listener) net.Listener { return &limitedListener{Listener: l, c: c} }

type limitedListener struct {
	net.Listener
	c *connLimiter
}

// Accept returns the next connection within the caps, closing those past them.
func (l *limitedListener) Accept() (net.Conn, error) {
	c := l.c
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := addrKey(conn.RemoteAddr())
		if !c.accepts.allow(addr) {
			c.rateRefused.Inc()
			_ = conn.Close()
			continue
		}
		if c.open.Add(1) > c.limit.Load() {
			c.open.Add(-1)
			c.refused.Inc()
			_ = conn.Close()
			continue
		}
		if tc, ok := conn.(*net.TCPConn); ok && c.userTimeout > 0 {
			_ = setTCPUserTimeout(tc, c.userTimeout) // as grpc-go does: best effort
		}
		cc := &countedConn{Conn: conn, c: c, key: connKey(conn.RemoteAddr(), conn.LocalAddr()), addr: addr}
		if refused := c.admit(cc); refused != nil {
			c.open.Add(-1)
			refused.Inc()
			_ = conn.Close()
			continue
		}
		if c.authTimeout > 0 {
			cc.timer.Store(time.AfterFunc(c.authTimeout, cc.expire))
			if cc.state.Load() == connClosed {
				cc.stopTimer() // closed before the timer was stored: Close could not stop it
			}
		}
		return cc, nil
	}
}

// admit counts cc as open from its address and as unauthenticated, in all and for its address, unless a
// cap is reached: then it returns the counter of that refusal.
func (c *connLimiter) admit(cc *countedConn) prometheus.Counter {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.perAddressAll > 0 && c.byAddrAll[cc.addr] >= c.perAddressAll {
		return c.addrRefused
	}
	if c.unauthLimit > 0 && c.unauth.Load() >= c.unauthLimit {
		return c.unauthRefused
	}
	if c.perAddress > 0 && c.byAddr[cc.addr] >= c.perAddress {
		return c.unauthRefused
	}
	c.unauth.Add(1)
	c.byAddr[cc.addr]++
	c.byAddrAll[cc.addr]++
	c.conns[cc.key] = cc
	return nil
}

// leaveUnauthenticated gives cc's places under the unauthenticated caps back; the caller won the state
// transition out of connUnauthenticated, so it runs once per connection.
func (c *connLimiter) leaveUnauthenticated(cc *countedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaveUnauthenticatedLocked(cc)
}

func (c *connLimiter) leaveUnauthenticatedLocked(cc *countedConn) {
	c.unauth.Add(-1)
	decrement(c.byAddr, cc.addr)
}

// decrement counts one less for key, forgetting a key at 0: the maps hold only what is open.
func decrement(m map[string]int, key string) {
	if m[key]--; m[key] <= 0 {
		delete(m, key)
	}
}

// addrKey is the IP address a per-address cap counts (auth's peer key: IPv6 addresses one by one, an
// IPv4-mapped address as its IPv4 one); a non-IP address counts as itself.
func addrKey(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(t.IP); ok {
			return ip.Unmap().WithZone("").String()
		}
	}
	if a == nil {
		return ""
	}
	return a.String()
}

// connKey names a connection by both its ends, as a gRPC call's peer does: the remote address alone can
// repeat on a listener bound to several local addresses.
func connKey(remote, local net.Addr) string {
	if remote == nil || local == nil {
		return ""
	}
	return remote.String() + "|" + local.String()
}

// authenticated records that the call of ctx presented a valid token of node: its connection stops
// counting against the unauthenticated caps and its deadline, and counts as one of node's. A node that
// already holds perNode connections gets ResourceExhausted instead, and the connection stays
// unauthenticated: bounded as a connection without a token is, closed at its deadline unless a later call
// finds a place. A connection counts for the node of its first authenticated call only. Called by the auth
// interceptor on every authenticated call, so on an authenticated connection it is a map lookup and a
// load.
func (c *connLimiter) authenticated(ctx context.Context, node string) error {
	p, ok := peer.FromContext(ctx)
	if c == nil || !ok {
		return nil
	}
	c.mu.Lock()
	cc := c.conns[connKey(p.Addr, p.LocalAddr)]
	if cc == nil || cc.state.Load() != connUnauthenticated {
		c.mu.Unlock()
		return nil
	}
	if c.perNode > 0 && c.byNode[node] >= c.perNode {
		c.mu.Unlock()
		c.nodeRefused.Inc()
		return status.Errorf(codes.ResourceExhausted,
			"node %q already holds %d connections to this replica (--max-connections-per-node); a sidecar needs "+
				"one: close another or retry later",
			node, c.perNode)
	}
	// Close and expire take the state without the lock: this may lose to them, and then counts nothing.
	won := cc.state.CompareAndSwap(connUnauthenticated, connAuthenticated)
	if won {
		cc.node = node
		c.byNode[node]++
		c.leaveUnauthenticatedLocked(cc)
	}
	c.mu.Unlock()
	if won {
		cc.stopTimer()
	}
	return nil
}

// A countedConn's state: it leaves connUnauthenticated once, to connAuthenticated or connClosed, and
// whichever transition does so gives its place under the unauthenticated cap back.
const (
	connUnauthenticated int32 = iota
	connAuthenticated
	connClosed
)

// countedConn gives its places back once, on the first Close.
type countedConn struct {
	net.Conn
	c     *connLimiter
	key   string // both ends: the conns map
	addr  string // the remote IP address: the per-address caps
	node  string // the node it counts for once authenticated; guarded by c.mu
	timer atomic.Pointer[time.Timer]
	state atomic.Int32
	once  sync.Once
}

// stopTimer stops the authentication deadline, so that a connection that authenticated or closed is not
// kept reachable by a pending timer until it fires: a client that connects and resets in a loop must not
// pin a minute's worth of closed connections.
func (cc *countedConn) stopTimer() {
	if t := cc.timer.Load(); t != nil {
		t.Stop()
	}
}

// expire closes the connection if no call on it was authenticated in time. Closing wins the state
// transition first, so a call authenticated at this very moment either marks the connection before (it
// stays open) or finds it closed.
func (cc *countedConn) expire() {
	if cc.state.CompareAndSwap(connUnauthenticated, connClosed) {
		cc.c.leaveUnauthenticated(cc)
		cc.c.unauthExpired.Inc()
		_ = cc.Close()
	}
}

func (cc *countedConn) Close() error {
	cc.once.Do(func() {
		c := cc.c
		was := cc.state.Swap(connClosed)
		cc.stopTimer()
		c.mu.Lock()
		switch was {
		case connUnauthenticated:
			c.leaveUnauthenticatedLocked(cc)
		case connAuthenticated:
			// authenticated set node under the lock before it let go of it: this Swap saw its transition.
			decrement(c.byNode, cc.node)
		}
		decrement(c.byAddrAll, cc.addr)
		if c.conns[cc.key] == cc {
			delete(c.conns, cc.key)
		}
		c.mu.Unlock()
		c.open.Add(-1)
	})
	return cc.Conn.Close()
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
