// SPDX-License-Identifier: Apache-2.0

package server

import (
	"testing"

	"golang.org/x/time/rate"
)

// TestClientLimitsFollowTheNodeCount: the defaults grow with the cluster from the former fixed limits, and
// a flag set by hand fixes its half of the limit.
func TestClientLimitsFollowTheNodeCount(t *testing.T) {
	for _, tc := range []struct {
		name      string
		scale     scale
		nodes     int
		wantQPS   rate.Limit
		wantBurst int
	}{
		{"no nodes yet: the floor", kubeAPIScale, 0, 50, 100},
		{"small cluster: the floor", kubeAPIScale, 100, 50, 100},
		{"10,000 nodes", kubeAPIScale, 10000, 2000, 10000},
		{"qps by hand, burst scaled", kubeAPIScale.fixed(300, 0), 10000, 300, 10000},
		{"both by hand", kubeAPIScale.fixed(300, 600), 10000, 300, 600},
		{"token reviews at 10,000", tokenReviewScale, 10000, 500, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newScaledLimiter(tc.scale)
			l.setNodes(tc.nodes)
			if got := l.l.Limit(); got != tc.wantQPS {
				t.Errorf("qps = %v, want %v", got, tc.wantQPS)
			}
			if got := l.l.Burst(); got != tc.wantBurst {
				t.Errorf("burst = %v, want %v", got, tc.wantBurst)
			}
		})
	}
}
