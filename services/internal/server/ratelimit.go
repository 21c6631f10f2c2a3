package server

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/util/flowcontrol"
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
