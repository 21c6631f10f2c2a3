// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// decodingKubelets decodes a config as the kubelet-check helper does, with the manager policies' defaults.
type decodingKubelets struct{ calls int }

func (d *decodingKubelets) CheckData(_ context.Context, _ string, data []byte) (*configcheck.Checked, error) {
	d.calls++
	fields := map[string]any{}
	if err := sigsyaml.Unmarshal(data, &fields); err != nil {
		return nil, err
	}
	for k, v := range map[string]any{"cpuManagerPolicy": "none", "memoryManagerPolicy": "None"} {
		if _, ok := fields[k]; !ok {
			fields[k] = v
		}
	}
	return &configcheck.Checked{Fields: fields}, nil
}

// TestStateResetsRefuseBeforeAnyNode: a new revision that the kubelet of a node running one of the pool's
// revisions would refuse on its checkpointed CPU or memory manager state (disruption.Resets, on both
// configs as the node minor's helper decodes them) is ConfigInvalid DrainRequired naming the node, the state
// file and the fields: no snapshot, no node assigned. A change the managers' state does not hold, and a
// node whose running config the controller cannot know (local, its snapshot not in the cache or not the
// one the pool created), roll out.
func TestStateResetsRefuseBeforeAnyNode(t *testing.T) {
	const header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
	static := header + "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n"
	for _, tc := range []struct {
		name, running, next string
		local               bool   // the node runs its local config, not the pool's revision
		snapshotGone        bool   // the running revision's snapshot is not in the cache
		recreated           bool   // an object of the snapshot's name that the pool did not create
		want                string // in ConfigInvalid DrainRequired's message; "" when the node is assigned
	}{
		{name: "policy none to static", running: header + "maxPods: 42\n", next: static,
			want: "cpu_manager_state (cpuManagerPolicy: none → static)"},
		{name: "another reservation under static", running: static, next: header + "cpuManagerPolicy: static\nreservedSystemCPUs: \"0-1\"\n",
			want: "cpu_manager_state (reservedSystemCPUs: 0 → 0-1)"},
		{name: "memory manager policy", running: header, next: header + "memoryManagerPolicy: Static\n",
			want: "memory_manager_state (memoryManagerPolicy: None → Static)"},
		{name: "a field the state does not hold", running: static, next: static + "maxPods: 50\n"},
		{name: "a node on its local config", running: header, next: static, local: true},
		{name: "the running snapshot not in the cache", running: header, next: static, snapshotGone: true},
		{name: "the running snapshot re-created by someone else", running: header, next: static, recreated: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, n, wasSnap := runningRevisionOf(tc.running, !tc.local)
			wasRev := pool.Status.CurrentRevision
			next := configMap(map[string]string{"kubelet": tc.next})
			h := newHarness(t, pool, next, n)
			if tc.recreated {
				wasSnap = wasSnap.DeepCopy()
				wasSnap.UID = "another-uid"
			}
			if !tc.snapshotGone {
				if err := h.c.snapshots["kube-system"].GetStore().Add(wasSnap); err != nil {
					t.Fatal(err)
				}
			}
			kubelets := &decodingKubelets{}
			h.c.cfg.Kubelets, h.c.kubelets = kubelets, newKubeletChecks(kubelets, zap.NewNop(), h.clock)
			for range 2 {
				if _, err := h.c.sync(context.Background(), "blue"); err != nil {
					t.Fatal(err)
				}
			}
			last := h.pools.updates[len(h.pools.updates)-1]
			c := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionConfigInvalid)
			if tc.want == "" {
				if c == nil || c.Status != metav1.ConditionFalse || len(h.assigned()) != 1 {
					t.Errorf("ConfigInvalid %+v, assigned %v; want False and node a assigned", c, h.assigned())
				}
				return
			}
			nextRev := revision.Name("kube-system", "kubelet", next.Data)
			for _, want := range []string{tc.want, "(revision " + nextRev + ")", "node a (revision " + wasRev + ", kubelet 1.37)",
				"nothing is assigned", "kubectl dkc assign NODE... --configmap kube-system/blue-config --key kubelet --drain"} {
				if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonDrainRequired || !strings.Contains(c.Message, want) {
					t.Errorf("ConfigInvalid %+v, want True %s with %q", c, v1alpha1.ReasonDrainRequired, want)
				}
			}
			if got := h.assigned(); len(got) != 0 {
				t.Errorf("assigned %v a change its kubelet refuses on its state", got)
			}
			for _, a := range h.client.Actions() {
				if a.GetVerb() == "create" && a.GetResource().Resource == "configmaps" {
					t.Error("created a revision the nodes' kubelets refuse on their state")
				}
			}
			if kubelets.calls != 2 {
				t.Errorf("%d helper runs over two syncs, want 2 (each revision once)", kubelets.calls)
			}
		})
	}
}

// runningRevisionOf is a pool whose current revision is running, and node a (kubelet 1.37) that runs it
// (onIt; else its local config), and the revision's snapshot, which the caller adds to the cache.
func runningRevisionOf(running string, onIt bool) (*v1alpha1.KubeletConfigPool, *corev1.Node, *corev1.ConfigMap) {
	pool := testPool()
	wasRev, wasSnap := revision.Snapshot(pool, configMap(map[string]string{"kubelet": running}))
	pool.Status.CurrentRevision = wasRev
	wasSnap.UID = "snapshot-uid"
	pool.Status.RevisionSnapshots = &v1alpha1.RevisionSnapshots{Items: []v1alpha1.RevisionSnapshot{{
		Revision: wasRev, Namespace: wasSnap.Namespace, Name: wasSnap.Name, UID: wasSnap.UID, KubeletConfigKey: "kubelet"}}}
	src := revision.Source(pool, wasRev)
	active := &corev1.NodeConfigSource{ConfigMap: &src}
	if !onIt {
		active = nil
	}
	st, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: active, Active: active, LastKnownGood: active})
	n := node("a", map[string]string{nodeconfig.StatusAnnotation: string(st)}, nil)
	n.Status.NodeInfo.KubeletVersion = "v1.37.1"
	return pool, n, wasSnap
}

// TestCapacityRefusedBeforeAnyNode: a new revision under which the kubelet of a node running one of the
// pool's revisions would no longer admit the pods running there (capacity.Under: a lower maxPods fails
// the newest pod) is ConfigInvalid CapacityRefused naming the node and the pod: no snapshot, no node
// assigned, and the node's pods are not listed again at every sync (the verdict is kept capacityRecheck).
// One the pods still fit rolls out, and so does one a pool that may drain makes.
func TestCapacityRefusedBeforeAnyNode(t *testing.T) {
	const header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
	for _, tc := range []struct {
		name, next string
		mayDrain   bool
		want       string // in ConfigInvalid CapacityRefused's message; "" when the node is assigned
	}{
		{name: "maxPods below the pods running", next: header + "maxPods: 1\n", want: "default/newer (pod 2 of 1 allowed (OutOfpods))"},
		{name: "maxPods still above", next: header + "maxPods: 5\n"},
		// Its sidecar makes the same prediction and waits for the drain the pool makes then.
		{name: "maxPods below the pods running, a pool that may drain", next: header + "maxPods: 1\n", mayDrain: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, n, wasSnap := runningRevisionOf(header+"maxPods: 3\n", true)
			if tc.mayDrain {
				pool.Spec.Disruption = &v1alpha1.Disruption{Drain: v1alpha1.DrainAllowed}
			}
			n.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
				corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}
			n.Status.Allocatable = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("3"),
				corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}
			next := configMap(map[string]string{"kubelet": tc.next})
			h := newHarness(t, pool, next, n)
			if err := h.c.snapshots["kube-system"].GetStore().Add(wasSnap); err != nil {
				t.Fatal(err)
			}
			t0 := h.clock.Now()
			for i, name := range []string{"older", "newer"} {
				p := workload(name, "a", t0.Add(time.Duration(i-10)*time.Minute), readyAt(true, t0.Add(-time.Hour)))
				if _, err := h.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			kubelets := &decodingKubelets{}
			h.c.cfg.Kubelets, h.c.kubelets = kubelets, newKubeletChecks(kubelets, zap.NewNop(), h.clock)
			var after time.Duration
			for range 2 {
				var err error
				if after, err = h.c.sync(context.Background(), "blue"); err != nil {
					t.Fatal(err)
				}
			}
			last := h.pools.updates[len(h.pools.updates)-1]
			c := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionConfigInvalid)
			if tc.want == "" {
				if c == nil || c.Status != metav1.ConditionFalse || len(h.assigned()) != 1 {
					t.Errorf("ConfigInvalid %+v, assigned %v; want False and node a assigned", c, h.assigned())
				}
				return
			}
			for _, want := range []string{tc.want, "node a (revision " + pool.Status.CurrentRevision + ", kubelet 1.37)",
				"nothing is assigned"} {
				if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonCapacityRefused ||
					!strings.Contains(c.Message, want) {
					t.Errorf("ConfigInvalid %+v, want True %s with %q", c, v1alpha1.ReasonCapacityRefused, want)
				}
			}
			if after <= 0 || after > capacityRecheck {
				t.Errorf("requeued after %v, want within %v: the pods may go without an event the pool watches", after, capacityRecheck)
			}
			if strings.Contains(c.Message, "default/older") {
				t.Errorf("ConfigInvalid names the older pod, which the kubelet admits first: %s", c.Message)
			}
			if got := h.assigned(); len(got) != 0 {
				t.Errorf("assigned %v a change that fails its pods", got)
			}
			lists := 0
			for _, a := range h.client.Actions() {
				if a.GetVerb() == "list" && a.GetResource().Resource == "pods" {
					lists++
				}
			}
			if lists != 1 {
				t.Errorf("the node's pods listed %d times over two syncs within %v, want once", lists, capacityRecheck)
			}
		})
	}
}
