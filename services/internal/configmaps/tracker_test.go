// SPDX-License-Identifier: Apache-2.0

package configmaps

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// TestTrackFollowsReferences: a ConfigMap is watched exactly while some node references it, and the
// tracker holds nothing of nodes and ConfigMaps no longer referenced — with hash-suffixed ConfigMaps every
// edit is a new name. Run is not called: informers are created but never started, so nothing is contacted.
func TestTrackFollowsReferences(t *testing.T) {
	type ref struct{ node, key string }
	hashed := func(i int) string { return fmt.Sprintf("kube-system/cfg-%08x", i) }
	var moveOn, reset []ref
	for i := range 100 {
		n := fmt.Sprintf("n%d", i%10)
		moveOn = append(moveOn, ref{n, hashed(i)})
	}
	for i := range 10 {
		reset = append(reset, ref{fmt.Sprintf("n%d", i), ""})
	}
	for _, tc := range []struct {
		name        string
		refs        []ref
		wantWatched int
		wantNodes   int
	}{
		{"two nodes on one configmap", []ref{{"a", "kube-system/c"}, {"b", "kube-system/c"}}, 1, 2},
		{"nodes move on through hashed configmaps", moveOn, 10, 10},
		{"then all reset", append(moveOn, reset...), 0, 0},
		{"node deleted", []ref{{"a", "kube-system/c"}, {"b", "kube-system/d"}, {"a", ""}}, 1, 1},
		{"outside --config-namespaces", []ref{{"a", "other/c"}, {"b", "kube-system"}}, 0, 0},
		{"moved outside", []ref{{"a", "kube-system/c"}, {"a", "other/c"}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
			if err != nil {
				t.Fatal(err)
			}
			tr := New(Config{Client: client, Namespaces: resolve.NewNamespaces("kube-system"), OnChange: func(string) {}})
			for _, r := range tc.refs {
				tr.Track(r.node, r.key)
			}
			if got := tr.Watched(); got != tc.wantWatched {
				t.Errorf("Watched = %d, want %d", got, tc.wantWatched)
			}
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if len(tr.byNode) != tc.wantNodes {
				t.Errorf("%d nodes held, want %d", len(tr.byNode), tc.wantNodes)
			}
			if len(tr.refs) != tc.wantWatched {
				t.Errorf("references to %d configmaps held, want %d", len(tr.refs), tc.wantWatched)
			}
		})
	}
}

// TestNamespaceWatchedWholePastThreshold: past the threshold a namespace's referenced ConfigMaps share one
// namespace-wide informer instead of one each, until no node references a ConfigMap there. Run is not
// called: the per-ConfigMap informers stay until the namespace's has listed (TestNamespaceInformerServes).
func TestNamespaceWatchedWholePastThreshold(t *testing.T) {
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	tr := New(Config{Client: client, Namespaces: resolve.NewNamespaces("kube-system", "other"), OnChange: func(string) {}})
	tr.threshold = 3
	for i := range 3 {
		tr.Track(fmt.Sprintf("n%d", i), fmt.Sprintf("kube-system/c%d", i))
	}
	tr.Track("o", "other/c")
	if got := tr.Watched(); got != 4 {
		t.Fatalf("at the threshold: Watched = %d, want 4 (one per configmap)", got)
	}
	tr.Track("n3", "kube-system/c3")
	tr.Track("n4", "kube-system/c4")
	tr.mu.Lock()
	whole, perKey := len(tr.wholeNamespaces), len(tr.informers)
	tr.mu.Unlock()
	if whole != 1 || perKey != 4 {
		t.Errorf("past the threshold, before the namespace's informer listed: %d namespace-wide and %d per-configmap informers, want 1 and 4 (kube-system's kept until then, other's)", whole, perKey)
	}
	for i := range 4 {
		tr.Track(fmt.Sprintf("n%d", i), "")
	}
	tr.mu.Lock()
	whole = len(tr.wholeNamespaces)
	tr.mu.Unlock()
	if whole != 1 {
		t.Errorf("below the threshold again: the namespace-wide informer is gone, want it kept while kube-system is referenced")
	}
	tr.Track("n4", "")
	tr.Track("o", "")
	if got := tr.Watched(); got != 0 {
		t.Errorf("nothing referenced: Watched = %d, want 0", got)
	}
}

// TestNamespaceInformerServes runs a tracker whose every namespace is watched whole (threshold 0) on a fake
// clientset: referenced ConfigMaps are reported and served from the namespace's cache, unreferenced ones
// are neither.
func TestNamespaceInformerServes(t *testing.T) {
	cm := func(name, v string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, ResourceVersion: v}}
	}
	client := fake.NewClientset(cm("a", "1"), cm("b", "1"), cm("unreferenced", "1"))
	changed := make(chan string, 100)
	tr := New(Config{Client: client, Namespaces: resolve.NewNamespaces("kube-system"), OnChange: func(key string) { changed <- key }})
	tr.threshold = 0
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Track("n1", "kube-system/a")
	go func() { _ = tr.Run(ctx) }()
	// A key may be reported more than once (its Add event and the informer's first list both say it is
	// there); an unreferenced key never.
	expect := func(want string) {
		t.Helper()
		poll.Until(t, fmt.Sprintf("onChange(%q)", want), func() bool {
			for {
				select {
				case got := <-changed:
					if got == "kube-system/unreferenced" {
						t.Fatalf("onChange(%q) for a configmap no node references", got)
					}
					if got == want {
						return true
					}
				default:
					return false
				}
			}
		})
	}
	expect("kube-system/a") // listed
	tr.Track("n2", "kube-system/b")
	expect("kube-system/b") // already in the cache
	if got, ok, err := tr.Get("kube-system/b"); err != nil || !ok || got == nil || got.Name != "b" {
		t.Fatalf("Get(b) = %v, %v, %v; want b from the namespace's cache", got, ok, err)
	}
	if got, ok, err := tr.Get("kube-system/missing"); err != nil || !ok || got != nil {
		t.Errorf("Get(missing) = %v, %v, %v; want a trustworthy not-found", got, ok, err)
	}
	if got := tr.Watched(); got != 1 {
		t.Errorf("Watched = %d, want 1", got)
	}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm("unreferenced", "2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm("a", "2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("kube-system/a") // the unreferenced update before it was not reported
}
