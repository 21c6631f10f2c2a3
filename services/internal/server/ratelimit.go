// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/auth"
)

// scale is a client-side rate limit that grows with the cluster: perNode requests a second per Node
// (burst: burstPerNode per Node), never below the floor. One replica writes the status of every node it
// serves — the original design had each kubelet write its own, through a limiter of its own — so a fixed
// limit that protects the apiserver of a small cluster makes a large one wait minutes after a fan-out
// (10,000 nodes at 50 requests a second: over 200 s for one write each), while the node count says how many
// writes a fan-out brings. The apiserver is protected by API Priority and Fairness instead, which queues
// dkc-server's requests in a priority level of their own (deploy/base/server-apf.yaml), and by the bound
// on writes in flight (--max-inline-status-writes, --status-workers).
type scale struct {
	qps, burst               float64 // the floor
	qpsPerNode, burstPerNode float64
}

// fixed replaces the scaled rate (qps) and burst by the ones given, where not 0 (flags set by hand).
func (s scale) fixed(qps float64, burst int) scale {
	if qps > 0 {
		s.qps, s.qpsPerNode = qps, 0
	}
	if burst > 0 {
		s.burst, s.burstPerNode = float64(burst), 0
	}
	return s
}

// at is the limit for n Nodes.
func (s scale) at(n int) (rate.Limit, int) {
	return rate.Limit(max(s.qps, s.qpsPerNode*float64(n))), int(max(s.burst, s.burstPerNode*float64(n)))
}

// scaledLimiter is a flowcontrol.RateLimiter (client-go's client-side limiter) whose rate follows the number
// of Nodes in the cache (Run).
type scaledLimiter struct {
	scale scale
	l     *rate.Limiter

	mu    sync.Mutex
	nodes int
}

var _ flowcontrol.RateLimiter = (*scaledLimiter)(nil)

func newScaledLimiter(s scale) *scaledLimiter {
	qps, burst := s.at(0)
	return &scaledLimiter{scale: s, l: rate.NewLimiter(qps, burst)}
}

// setNodes sizes the limit for n Nodes.
func (s *scaledLimiter) setNodes(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n == s.nodes {
		return
	}
	s.nodes = n
	qps, burst := s.scale.at(n)
	s.l.SetLimit(qps)
	s.l.SetBurst(burst)
}

// run resizes the limit every interval from the Node cache, until ctx ends.
func (s *scaledLimiter) run(ctx context.Context, nodes corelisters.NodeLister, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if list, err := nodes.List(labels.Everything()); err == nil {
			s.setNodes(len(list))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// TryAccept takes a token if one is there (flowcontrol.RateLimiter).
func (s *scaledLimiter) TryAccept() bool { return s.l.Allow() }

// Accept waits for a token (flowcontrol.RateLimiter).
func (s *scaledLimiter) Accept() { _ = s.l.Wait(context.Background()) }

// Stop does nothing: the limiter holds no goroutine (flowcontrol.RateLimiter).
func (s *scaledLimiter) Stop() {}

// QPS is the current rate (flowcontrol.RateLimiter).
func (s *scaledLimiter) QPS() float32 { return float32(s.l.Limit()) }

// Wait waits for a token or ctx's end (flowcontrol.RateLimiter; what client-go's requests call).
func (s *scaledLimiter) Wait(ctx context.Context) error { return s.l.Wait(ctx) }

// keyedLimiter is a token bucket per key (a caller's IP address, a node), kept in a bounded LRU as auth's
// per-address TokenReview limiter keeps its own: a key evicted comes back with a full bucket, so what the
// buckets cost is bounded whatever the number of keys, and a key is never refused for another key's use.
type keyedLimiter struct {
	qps   rate.Limit
	burst int
	clock clock.PassiveClock

	mu      sync.Mutex
	buckets *lru.Cache // key -> *rate.Limiter
}

// maxLimiterKeys bounds a keyedLimiter's memory (about 200 bytes a key): every node of a 10,000-node
// cluster with room to spare.
const maxLimiterKeys = 16384

// newKeyedLimiter returns nil (no limit) for qps <= 0.
func newKeyedLimiter(qps float64, burst int) *keyedLimiter {
	if qps <= 0 {
		return nil
	}
	return &keyedLimiter{qps: rate.Limit(qps), burst: max(burst, 1), clock: clock.RealClock{},
		buckets: lru.New(maxLimiterKeys)}
}

// allow takes a token from key's bucket.
func (l *keyedLimiter) allow(key string) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.buckets.Get(key)
	if !ok {
		v = rate.NewLimiter(l.qps, l.burst)
		l.buckets.Add(key, v)
	}
	return v.(*rate.Limiter).AllowN(l.clock.Now(), 1)
}

// reportLimiter paces each node's ReportStatus calls: a token bucket per authenticated node, whatever
// node_name the call names (a call for another node is refused by the handler anyway). A report can cost a
// Node write, and the writes of all nodes share one client limit (--kube-api-qps): without it one node's
// token could spend that budget and hold every other node's status back. A sidecar sends one report at a
// time, each when its status changes (two or three per assignment, a restart's outcome, the re-send after a
// reconnect), and takes a refusal as any failed report: it keeps the report and retries after its backoff.
type reportLimiter struct {
	nodes   *keyedLimiter // nil: no limit
	refused prometheus.Counter
}

func newReportLimiter(qps float64, burst int, reg prometheus.Registerer) *reportLimiter {
	r := &reportLimiter{nodes: newKeyedLimiter(qps, burst),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "server",
			Name: "status_reports_rate_limited_total",
			Help: "ReportStatus calls refused with ResourceExhausted because their node reported faster than " +
				"--status-reports-per-node-qps (burst --status-reports-per-node-burst)."})}
	if reg != nil {
		reg.MustRegister(r.refused)
	}
	return r
}

// interceptor refuses a node's ReportStatus past its rate. It runs after auth, which put the caller's
// identity in the context; a call without one is left to the handler.
func (r *reportLimiter) interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if r == nil || r.nodes == nil || info.FullMethod != dkcv1.ConfigService_ReportStatus_FullMethodName {
			return handler(ctx, req)
		}
		if id, ok := auth.FromContext(ctx); ok && !r.nodes.allow(id.Node) {
			r.refused.Inc()
			return nil, status.Errorf(codes.ResourceExhausted,
				"node %q reports status faster than %g a second (burst %d, --status-reports-per-node-qps): retry later",
				id.Node, float64(r.nodes.qps), r.nodes.burst)
		}
		return handler(ctx, req)
	}
}
