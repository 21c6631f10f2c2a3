// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// perNodePool computes maxPods from each node's "size" label, over two slots.
func perNodePool(expression string) *v1alpha1.KubeletConfigPool {
	p := testPool()
	mu := intstr.FromInt32(2)
	p.Spec.MaxUnavailable = &mu
	p.Spec.PerNode = &v1alpha1.PerNode{Values: []v1alpha1.PerNodeValue{{Field: "maxPods", Expression: expression}}}
	return p
}

func sized(name, size string) *corev1.Node {
	lbls := map[string]string{"pool": "blue"}
	if size != "" {
		lbls["size"] = size
	}
	return node(name, nil, lbls)
}

// TestPerNodeValuesAssignEachNodeItsOwnRevision: each node is assigned the snapshot of its own values,
// created and recorded (with the pool's revision as its base) before it is assigned; the pool's revision
// stays the ConfigMap's; a node whose expression fails is failed, not assigned.
func TestPerNodeValuesAssignEachNodeItsOwnRevision(t *testing.T) {
	pool := perNodePool("node.metadata.labels['size'] == 'big' ? 250 : 110")
	budget := int32(2) // c's failure alone does not halt the pool
	pool.Spec.MaxFailures = &budget
	cm := configMap(map[string]string{"kubelet": goodConfig})
	h := newHarness(t, pool, cm, sized("a", "big"), sized("b", "small"), sized("c", ""))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	last := h.pools.updates[len(h.pools.updates)-1]
	base := revision.Name("kube-system", "kubelet", cm.Data)
	if last.Status.CurrentRevision != base {
		t.Errorf("current revision %s, want the ConfigMap's %s", last.Status.CurrentRevision, base)
	}
	got := map[string]string{} // node → the maxPods its snapshot holds
	revs := map[string]string{}
	for _, name := range h.assigned() {
		n, err := h.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a, ok := assignmentOf(n)
		if !ok {
			t.Fatalf("node %s has no assignment", name)
		}
		snap, err := h.client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), revision.SnapshotName("blue", a.Revision), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("node %s's snapshot: %v", name, err)
		}
		if snap.Labels[v1alpha1.LabelBaseRevision] != base {
			t.Errorf("snapshot %s labelled base %q, want %s", snap.Name, snap.Labels[v1alpha1.LabelBaseRevision], base)
		}
		if r, ok := last.Status.RevisionSnapshots.Snapshot(a.Revision); !ok || r.UID != snap.UID || r.BaseRevision != base {
			t.Errorf("record of %s: %+v (%v), want UID %s base %s", a.Revision, r, ok, snap.UID, base)
		}
		for _, l := range strings.Split(snap.Data["kubelet"], "\n") {
			if strings.HasPrefix(l, "maxPods:") {
				got[name] = strings.TrimSpace(strings.TrimPrefix(l, "maxPods:"))
			}
		}
		revs[name] = a.Revision
	}
	if got["a"] != "250" || got["b"] != "110" || len(got) != 2 {
		t.Errorf("assigned maxPods %v, want a 250 and b 110, c not assigned", got)
	}
	if revs["a"] == revs["b"] {
		t.Errorf("a and b share revision %s", revs["a"])
	}
	if len(last.Status.FailedNodes) != 1 || last.Status.FailedNodes[0].Name != "c" ||
		last.Status.FailedNodes[0].Reason != v1alpha1.FailureConfigRefused ||
		!strings.Contains(last.Status.FailedNodes[0].Error, "spec.perNode.values[0] (maxPods)") {
		t.Errorf("failed nodes %+v, want c ConfigRefused naming the value", last.Status.FailedNodes)
	}
	if len(last.Status.NodeRevisions) != 2 {
		t.Errorf("node revisions %+v, want a's and b's (c's values could not be computed)", last.Status.NodeRevisions)
	}
}

// TestPerNodeExpressionThatDoesNotCompileIsInvalid: nothing is created or assigned.
func TestPerNodeExpressionThatDoesNotCompileIsInvalid(t *testing.T) {
	h := newHarness(t, perNodePool("node.metadata.labels['size'] ==="), configMap(map[string]string{"kubelet": goodConfig}),
		sized("a", "big"))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := h.assigned(); len(got) != 0 {
		t.Errorf("assigned %v", got)
	}
	last := h.pools.updates[len(h.pools.updates)-1]
	c := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionConfigInvalid)
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "spec.perNode.values[0] (maxPods)") {
		t.Errorf("ConfigInvalid %+v, want True naming the value", c)
	}
}

// TestNodeChangedByWhatValuesRead: what per-node values read of a Node syncs its pools; a heartbeat does not.
func TestNodeChangedByWhatValuesRead(t *testing.T) {
	base := sized("a", "big")
	base.Status.Capacity = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}
	base.Status.NodeInfo.KubeletVersion = "v1.34.2"
	for _, tc := range []struct {
		name   string
		change func(*corev1.Node)
		want   bool
	}{
		{name: "heartbeat", change: func(n *corev1.Node) {
			n.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
		}},
		{name: "capacity", want: true, change: func(n *corev1.Node) {
			n.Status.Capacity[corev1.ResourceMemory] = resource.MustParse("16Gi")
		}},
		{name: "kubelet upgraded", want: true, change: func(n *corev1.Node) { n.Status.NodeInfo.KubeletVersion = "v1.35.0" }},
		{name: "annotation", want: true, change: func(n *corev1.Node) { n.Annotations["team"] = "x" }},
		{name: "label", want: true, change: func(n *corev1.Node) { n.Labels["size"] = "small" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := base.DeepCopy()
			tc.change(n)
			if got := nodeChanged(base, n); got != tc.want {
				t.Errorf("nodeChanged %v, want %v", got, tc.want)
			}
		})
	}
}

// TestComputedValuesAreKeptPerNodeVersion: a node's result is computed again only when the Node, the pool's
// per-node spec or its revision changes, or an exception applied to it expires.
func TestComputedValuesAreKeptPerNodeVersion(t *testing.T) {
	pool := perNodePool("node.metadata.labels['size'] == 'big' ? 250 : 110")
	expires := metav1.NewTime(time.Date(2026, 1, 1, 1, 0, 0, 0, time.UTC))
	pool.Spec.PerNode.Exceptions = []v1alpha1.PerNodeException{{Name: "x", Node: "a",
		Patch: apiextensionsv1.JSON{Raw: []byte(`{"eventRecordQPS":7}`)}, Expires: &expires}}
	ref := pool.Spec.ConfigMap
	data := map[string]string{"kubelet": goodConfig}
	now := expires.Add(-time.Hour)
	c := newComputedValues()
	values, err := c.of(pool, "base")
	if err != nil {
		t.Fatal(err)
	}
	n := sized("a", "big")
	n.ResourceVersion = "1"
	_, first, _ := values.compute(n, ref, data, now)
	n.Labels["size"] = "small" // not seen while the resourceVersion says the Node is the same
	if _, rev, _ := values.compute(n, ref, data, now); rev != first {
		t.Errorf("recomputed for the same resourceVersion: %s, want %s kept", rev, first)
	}
	n.ResourceVersion = "2"
	_, second, _ := values.compute(n, ref, data, now)
	if second == first {
		t.Errorf("not recomputed for a new resourceVersion")
	}
	res, third, _ := values.compute(n, ref, data, expires.Time)
	if third == second || strings.Contains(strings.Join(res.Values, ","), "exception x") {
		t.Errorf("the expired exception still applies: %v", res.Values)
	}
	if again, _ := c.of(pool, "base"); again != values {
		t.Errorf("the pool's values were made again for the same spec and revision")
	}
	if again, _ := c.of(pool, "other"); again == values {
		t.Errorf("the pool's values were kept for another revision")
	}
}
