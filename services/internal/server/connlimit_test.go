// SPDX-License-Identifier: Apache-2.0

package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/internal/poll"
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

// TestUnauthenticatedCapPerAddress: one caller address holds at most its share of the unauthenticated
// connections, so that one pod cannot keep the whole cap; another address still gets in, and a place
// given back is taken again.
func TestUnauthenticatedCapPerAddress(t *testing.T) {
	l := newConnLimiter(connLimits{max: 100, maxUnauthenticated: 10, maxUnauthenticatedPerAddress: 2, authTimeout: time.Hour}, nil)
	addr := serveAccepted(t, l)
	dial := func(from string) net.Conn {
		t.Helper()
		return dialTCP(t, addr, from)
	}
	first := dial("127.0.0.1")
	dial("127.0.0.1")
	third := dial("127.0.0.1")
	other := dial("127.0.0.2")
	if !closedByServer(third) {
		t.Error("a third unauthenticated connection from one address was kept, want it closed at accept")
	}
	if closedByServer(other) {
		t.Error("another address's connection was closed")
	}
	first.Close()
	poll.Until(t, "the closed connection's place back", func() bool { return l.unauth.Load() == 2 })
	if again := dial("127.0.0.1"); closedByServer(again) {
		t.Error("a place given back was not taken again")
	}
	if got := testutil.ToFloat64(l.unauthRefused); got != 1 {
		t.Errorf("%.0f refusals counted, want 1", got)
	}
}

// TestClosedConnectionsAreNotKept: a connection closed before its authentication deadline is not kept
// reachable by the pending deadline: a client that connects and resets in a loop must not grow the heap
// by a minute's worth of closed connections (the cap bounds only open ones).
func TestClosedConnectionsAreNotKept(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 5,000 connections")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory is not what a connection costs")
	}
	const n = 5000
	l := newConnLimiter(connLimits{max: 100, maxUnauthenticated: 10, authTimeout: time.Hour}, nil)
	addr := serveAccepted(t, l)
	before := memory()
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		c.Close()
	}
	poll.Until(t, "the server to close every connection", func() bool { return l.open.Load() == 0 })
	after := memory()
	grown := int64(after.heap) - int64(before.heap)
	t.Logf("%d connections opened and closed: heap grew %d B (%.0f B each)", n, grown, float64(grown)/n)
	if grown > 1<<20 {
		t.Errorf("heap grew %d B after %d closed connections: something (a pending deadline?) keeps them", grown, n)
	}
}

// serveAccepted accepts connections through l on a loopback port until the test ends and closes each as
// soon as its peer does, as a server would; it returns the address.
func serveAccepted(t *testing.T, l *connLimiter) string {
	t.Helper()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := l.wrap(tcp)
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return tcp.Addr().String()
}

// closedByServer says whether the server closed c (read returns EOF or a reset within a second).
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}
