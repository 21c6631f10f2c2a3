package configmaps

import (
	"fmt"
	"testing"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dkc-dev/dkc/services/resolve"
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
			tr := New(client, resolve.NewNamespaces("kube-system"), zap.NewNop(), func(string) {})
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
