// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodedrain"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// TestPoolDrainsANodeItsSidecarSaysMustBe: a pool that may drain assigns as any pool; the node's sidecar
// refuses the revision for want of a drain; the controller cordons the node as the pool's, drains it and
// marks it drained for the snapshot's version, the node counting as in progress throughout; once the
// node runs the revision, the pool takes its marks off and uncordons it. A drain that fails (a pod no
// controller recreates) fails the node, which is released too.
func TestPoolDrainsANodeItsSidecarSaysMustBe(t *testing.T) {
	for _, tc := range []struct {
		name    string
		barePod bool // a pod without a controller on the node: the drain fails
	}{
		{name: "drained, then released once it runs the revision"},
		{name: "the drain fails: failed and released", barePod: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pool := testPool()
			pool.Spec.Disruption = &v1alpha1.Disruption{Drain: v1alpha1.DrainAllowed,
				DrainTimeout: &metav1.Duration{Duration: time.Minute}}
			h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), node("a", nil, nil))
			h.c.runCtx = ctx
			defer h.c.drains.stopAll()
			if tc.barePod {
				if _, err := h.client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "default"},
					Spec:       corev1.PodSpec{NodeName: "a"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			sync := func() {
				t.Helper()
				if _, err := h.c.sync(ctx, "blue"); err != nil {
					t.Fatal(err)
				}
				// The stored pool is what the next sync reads.
				last := h.pools.updates[len(h.pools.updates)-1]
				if err := h.c.pools.GetStore().Update(last); err != nil {
					t.Fatal(err)
				}
			}
			sync() // assigns a
			last := h.pools.updates[len(h.pools.updates)-1]
			snap, err := h.client.CoreV1().ConfigMaps("kube-system").Get(ctx,
				revision.SnapshotName("blue", last.Status.CurrentRevision), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			snap.UID = "snapshot-uid" // the fake clientset gives none; an empty one is the local config's mark
			if err := h.c.snapshots["kube-system"].GetIndexer().Add(snap); err != nil {
				t.Fatal(err)
			}
			// The sidecar refuses it for want of a drain; the cache shows it.
			report := func(active bool, statusErr nodeconfig.StatusError) *corev1.Node {
				t.Helper()
				n, err := h.client.CoreV1().Nodes().Get(ctx, "a", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system",
					Name: snap.Name, KubeletConfigKey: "kubelet", UID: snap.UID, ResourceVersion: snap.ResourceVersion}}
				st := corev1.NodeConfigStatus{Assigned: src, Error: string(statusErr)}
				if active {
					st.Active = src
				}
				raw, _ := json.Marshal(st)
				n.Annotations[nodeconfig.StatusAnnotation] = string(raw)
				if err := h.nodes.Update(n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			report(false, nodeconfig.DrainRequiredError)
			sync()
			if got := h.pools.updates[len(h.pools.updates)-1].Status.Nodes.InProgress; got != 1 {
				t.Errorf("%d nodes in progress while draining, want 1", got)
			}
			stored := func() *corev1.Node {
				n, err := h.client.CoreV1().Nodes().Get(ctx, "a", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			if tc.barePod {
				poll.For(t, 10*time.Second, 10*time.Millisecond, "the drain to fail", func() bool {
					_, failed := h.c.drains.of("blue", last.Status.CurrentRevision, "a")
					return failed != ""
				})
				report(false, nodeconfig.DrainRequiredError) // the cache shows the cordon
				sync()
				st := h.pools.updates[len(h.pools.updates)-1].Status
				if len(st.FailedNodes) != 1 || st.FailedNodes[0].Reason != v1alpha1.FailureDrainFailed ||
					!strings.Contains(st.FailedNodes[0].Error, "bare") {
					t.Errorf("failed nodes %+v, want a DrainFailed naming the bare pod", st.FailedNodes)
				}
			} else {
				poll.For(t, 10*time.Second, 10*time.Millisecond, "node a marked drained", func() bool {
					if _, f := h.c.drains.of("blue", last.Status.CurrentRevision, "a"); f != "" {
						t.Fatalf("drain failed: %s", f)
					}
					return nodeconfig.IsDrainedFor(stored(), snap.UID, snap.ResourceVersion)
				})
				if n := stored(); n.Annotations[nodedrain.CordonedAnnotation] != "pool/blue" {
					t.Errorf("cordoned by %q, want pool/blue", n.Annotations[nodedrain.CordonedAnnotation])
				}
				report(false, "") // the sidecar restarts the kubelet: not released yet
				sync()
				if !stored().Spec.Unschedulable {
					t.Fatal("released before the node runs the revision")
				}
				report(true, "") // runs it, in its trial
				sync()
			}
			n := stored()
			_, cordoned := n.Annotations[nodedrain.CordonedAnnotation]
			_, drained := n.Annotations[nodeconfig.DrainedAnnotation]
			if n.Spec.Unschedulable || cordoned || drained {
				t.Errorf("node a after: unschedulable %v, cordon mark %v, drain mark %v; want released",
					n.Spec.Unschedulable, cordoned, drained)
			}
		})
	}
}
