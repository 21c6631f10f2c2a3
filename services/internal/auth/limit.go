// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// Defaults of the limits (dkc-server flags).
const (
	// DefaultReviewQPS and DefaultReviewBurst are the client-side limit of TokenReviews, apart from the
	// client that writes Node status. A connected sidecar costs one review per token (rotated hourly) and
	// one per token cache TTL, its stream's re-check (Reauthenticate; its status reports share it): 5,000
	// nodes at the default 1-minute TTL are 84 reviews a second. Raise them with the node count, or the
	// TTL; a re-check that waits for the limiter longer than ReviewTimeout is retried later, not a refusal.
	DefaultReviewQPS   = 100
	DefaultReviewBurst = 200
	// DefaultPeerQPS and DefaultPeerBurst bound the reviews one caller address can cause. A node has one
	// sidecar and needs a review a minute at most; the burst covers a host running a few simulated nodes
	// that all reconnect at once (the dev cluster) and integration tests minting tokens.
	DefaultPeerQPS   = 1
	DefaultPeerBurst = 20
)

// MaxHeaderListBytes caps the metadata of one gRPC call (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE: advertised
// to clients, which then refuse to send more, and enforced by the server on those that do not). grpc-go's
// default is 16 MiB, which any caller could make dkc-server read and HPACK-decode before auth runs; dkc's
// calls carry one token of at most MaxTokenBytes and a few hundred bytes of gRPC's own headers.
const MaxHeaderListBytes = MaxTokenBytes + 16<<10

// ServerOptions are the gRPC server options the authenticator relies on: the header-list cap.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxHeaderListSize(MaxHeaderListBytes)}
}

// NewReviewClient returns the client TokenReviews go through: cfg's apiserver and credentials with a
// client-side rate limit of its own (qps, burst). Each clientset has one limiter, so reviews driven by
// unauthenticated callers can only wait on each other, never on the limiter of the client that writes Node
// status. Its User-Agent gets "/token-review" so audit logs tell the two apart.
func NewReviewClient(cfg *rest.Config, qps float64, burst int) (kubernetes.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst, c.RateLimiter = float32(qps), burst, nil
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	c.UserAgent += "/token-review"
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("create token review client: %w", err)
	}
	return cs, nil
}

// maxPeers bounds the per-peer limiter's memory (about 200 bytes a peer). A peer evicted from it comes
// back with a full bucket, so an attacker with more addresses than this gets a burst per address; the
// review client's own limit still caps the total.
const maxPeers = 16384

// peerLimiter is a token bucket per caller address, in a bounded LRU.
type peerLimiter struct {
	qps   rate.Limit
	burst int
	clock clock.PassiveClock

	mu    sync.Mutex
	peers *lru.Cache // peer key -> *rate.Limiter
}

// newPeerLimiter returns nil (no limit) for qps <= 0.
func newPeerLimiter(qps float64, burst int) *peerLimiter {
	if qps <= 0 {
		return nil
	}
	return &peerLimiter{qps: rate.Limit(qps), burst: max(burst, 1), clock: clock.RealClock{}, peers: lru.New(maxPeers)}
}

// allow takes a token from addr's bucket.
func (l *peerLimiter) allow(addr string) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.peers.Get(addr)
	if !ok {
		v = rate.NewLimiter(l.qps, l.burst)
		l.peers.Add(addr, v)
	}
	return v.(*rate.Limiter).AllowN(l.clock.Now(), 1)
}

// peerKey is what the per-peer limit counts: the caller's IP address, not its port (every new connection
// has a new one). IPv6 addresses count one by one too, not by /64: the callers are nodes, and the nodes of
// one subnet share its /64 (clouds give each node one address from its subnet's /64), so a /64 bucket
// would let the 20 first of a subnet's nodes reconnect at once after a replica restart and the rest one a
// second. Someone able to send from many addresses of a /64 gets a bucket for each, as in a subnet of
// many IPv4 addresses; what they all may cause together stays bounded by the TokenReview client's own
// limit (--token-review-qps), and maxPeers bounds what the buckets cost (docs/security.md).
func peerKey(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	var ip netip.Addr
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		ip, _ = netip.AddrFromSlice(a.IP)
	} else if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
		ip = ap.Addr()
	} else {
		return p.Addr.String() // not IP (bufconn, unix socket): one peer per address
	}
	// An IPv4 caller of a dual-stack listener arrives as ::ffff:a.b.c.d: the same peer as a.b.c.d. A zone
	// (fe80::1%eth0) names an interface, not another host.
	return ip.Unmap().WithZone("").String()
}
