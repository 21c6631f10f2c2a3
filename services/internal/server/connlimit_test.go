package server

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// TestConnectionCapFollowsTheNodeCount: --max-connections 0 sizes the cap to the Node cache, never below
// the floor; a cap set by flag stays.
func TestConnectionCapFollowsTheNodeCount(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flag  int
		nodes int
		want  int64
	}{
		{"empty cluster: the floor", 0, 0, connFloor},
		{"small cluster: the floor", 0, 500, connFloor},
		{"10,000 nodes and a tenth", 0, 10000, 11000},
		{"set by flag", 300, 10000, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newConnLimiter(connLimits{max: tc.flag}, nil)
			l.resize(nodeLister(tc.nodes))
			if got := l.limit.Load(); got != tc.want {
				t.Errorf("cap %d, want %d", got, tc.want)
			}
		})
	}
}

func nodeLister(n int) corelisters.NodeLister {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for i := range n {
		_ = idx.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}})
	}
	return corelisters.NewNodeLister(idx)
}
