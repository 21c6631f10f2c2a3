// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// workload is a pod on node created at created; mods shape its status.
func workload(name, node string, created time.Time, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid"),
		CreationTimestamp: metav1.Time{Time: created}}, Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, m := range mods {
		m(p)
	}
	return p
}

func readyAt(ready bool, at time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: st,
			LastTransitionTime: metav1.Time{Time: at}})
	}
}

func failedWith(reason string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, reason, "Pod was rejected: Node didn't have enough resource"
	}
}

func TestFared(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	before, after := at.Add(-time.Hour), at.Add(time.Minute)
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string // "" (left out), "notready" or "failed"
	}{
		{name: "Ready since before: fine", pod: workload("p", "a", before, readyAt(true, before))},
		{name: "Ready again after the restart: fine", pod: workload("p", "a", before, readyAt(true, after))},
		{name: "lost readiness after the assignment: not ready", pod: workload("p", "a", before, readyAt(false, after)), want: "notready"},
		{name: "lost it in the assignment's second: not ready", pod: workload("p", "a", before, readyAt(false, at)), want: "notready"},
		{name: "not Ready since before the assignment: not the assignment's doing", pod: workload("p", "a", before, readyAt(false, before))},
		{name: "not Ready at the assignment, its condition rewritten by the restart: left out",
			pod: workload("p", "a", before, readyAt(false, after), func(p *corev1.Pod) { p.UID = "not-ready-before" })},
		{name: "created after the assignment: left out", pod: workload("p", "a", after, readyAt(false, after))},
		{name: "no Ready condition yet: left out", pod: workload("p", "a", before)},
		{name: "being deleted (evicted by a drain): left out", pod: workload("p", "a", before, readyAt(false, after),
			func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: after} })},
		{name: "succeeded: left out", pod: workload("p", "a", before, readyAt(false, after),
			func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })},
		{name: "rejected OutOfpods after the assignment: failed", pod: workload("p", "a", before, readyAt(false, after), failedWith("OutOfpods")), want: "failed"},
		{name: "preempted to admit a critical pod: failed", pod: workload("p", "a", before, readyAt(false, after), failedWith("Preempting")), want: "failed"},
		{name: "OutOfcpu: failed", pod: workload("p", "a", before, readyAt(false, after), failedWith("OutOfcpu")), want: "failed"},
		{name: "evicted by the kubelet (DisruptionTarget after): failed", pod: workload("p", "a", before, readyAt(false, before), failedWith("Evicted"),
			func(p *corev1.Pod) {
				p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget,
					Status: corev1.ConditionTrue, LastTransitionTime: metav1.Time{Time: after}})
			}), want: "failed"},
		{name: "rejected before the assignment: not the assignment's doing", pod: workload("p", "a", before, readyAt(false, before), failedWith("OutOfpods"))},
		{name: "failed, time unknown, never seen running: left out rather than blamed", pod: workload("p", "a", before, failedWith("OutOfpods"))},
		{name: "rejected with no time, seen running since the assignment: failed", pod: workload("p", "a", before, failedWith("OutOfpods"),
			func(p *corev1.Pod) { p.UID = "seen" }), want: "failed"},
		{name: "failed by its own containers: not the kubelet's verdict", pod: workload("p", "a", before, readyAt(false, after), failedWith("Error"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fared([]corev1.Pod{*tc.pod}, at, podMemory{running: func(uid types.UID) bool { return uid == "seen" },
				notReadyBefore: func(uid types.UID) bool { return uid == "not-ready-before" }})
			kind := ""
			if len(got) == 1 {
				switch {
				case got[0].Failed != "":
					kind = "failed"
				case !got[0].NotReadySince.IsZero():
					kind = "notready"
				}
				if got[0].Name != "default/p" {
					t.Errorf("name %q, want default/p", got[0].Name)
				}
			}
			if len(got) > 1 || kind != tc.want {
				t.Errorf("fared = %+v, want %q", got, tc.want)
			}
		})
	}
}

// TestPoolWaitsForThePodsOfItsNodes: a node that runs the revision as last-known-good stays in progress
// (WaitingForPods, the next node not assigned) while a pod that ran there before lost its readiness after
// the assignment; once the pod is Ready again the node passes the gate and the next is assigned. A pod the
// kubelet rejects after the assignment fails the node, named. With the gate off, neither holds anything.
func TestPoolWaitsForThePodsOfItsNodes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gateOff bool
		rejects bool // the kubelet rejects the pod (OutOfpods) instead of its readiness flipping
	}{
		{name: "waits for the pod to be Ready again"},
		{name: "a pod the kubelet rejected fails the node", rejects: true},
		{name: "gate off: moves on", gateOff: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool := testPool()
			if tc.gateOff {
				pool.Spec.Disruption = &v1alpha1.Disruption{PodReadinessTimeout: &metav1.Duration{}}
			}
			h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), node("a", nil, nil), node("b", nil, nil))
			t0 := h.clock.Now()
			pod := workload("web-1", "a", t0.Add(-time.Hour), readyAt(true, t0.Add(-time.Hour)))
			// Not Ready since before the assignment; the restart writes its condition anew (a new time).
			stale := workload("web-0", "a", t0.Add(-time.Hour), readyAt(false, t0.Add(-time.Hour)))
			for _, p := range []*corev1.Pod{pod, stale} {
				if _, err := h.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			sync := func() time.Duration {
				t.Helper()
				after, err := h.c.sync(ctx, "blue")
				if err != nil {
					t.Fatal(err)
				}
				last := h.pools.updates[len(h.pools.updates)-1]
				if err := h.c.pools.GetStore().Update(last); err != nil {
					t.Fatal(err)
				}
				return after
			}
			sync() // assigns a
			if got := h.assigned(); strings.Join(got, ",") != "a" {
				t.Fatalf("assigned %v, want [a]", got)
			}
			sync() // a is in progress, its pod still runs: seen running
			// a's kubelet restarts into the revision, the pod loses its readiness (or is rejected), and a
			// proves the revision: the cache shows a as assigned, active and last-known-good.
			h.clock.Step(30 * time.Second)
			pod.Status.Conditions = nil
			if tc.rejects {
				// As the kubelet writes a rejection: no condition, so no time; seen running before.
				failedWith("OutOfpods")(pod)
			} else {
				readyAt(false, h.clock.Now().Add(-20*time.Second))(pod)
			}
			if _, err := h.client.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			stale.Status.Conditions = nil
			readyAt(false, h.clock.Now().Add(-20*time.Second))(stale)
			if _, err := h.client.CoreV1().Pods("default").UpdateStatus(ctx, stale, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			last := h.pools.updates[len(h.pools.updates)-1]
			proveOn(t, h, "a", last.Status.CurrentRevision)
			after := sync()
			st := h.pools.updates[len(h.pools.updates)-1].Status
			updating := ptr.Deref(meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUpdating), metav1.Condition{})
			switch {
			case tc.gateOff:
				if got := h.assigned(); strings.Join(got, ",") != "a,b" {
					t.Fatalf("gate off: assigned %v, want [a b]", got)
				}
				return
			case tc.rejects:
				if len(st.FailedNodes) != 1 || st.FailedNodes[0].Reason != v1alpha1.FailurePodsFailed ||
					!strings.Contains(st.FailedNodes[0].Error, "default/web-1 (OutOfpods") {
					t.Fatalf("failed nodes %+v, want a PodsFailed naming default/web-1 (OutOfpods)", st.FailedNodes)
				}
				return
			}
			if st.Nodes.InProgress != 1 || updating.Reason != v1alpha1.ReasonWaitingForPods ||
				!strings.HasSuffix(updating.Message, "node a: default/web-1") {
				t.Fatalf("nodes %+v, Updating %s %q; want a in progress, WaitingForPods naming node a: default/web-1",
					st.Nodes, updating.Reason, updating.Message)
			}
			if after <= 0 || after > 5*time.Second {
				t.Errorf("requeue after %v, want a poll of at most 5s (pod readiness is no Node event)", after)
			}
			if got := h.assigned(); strings.Join(got, ",") != "a" {
				t.Fatalf("assigned %v while a waits for its pod, want [a]", got)
			}
			// Ready again: a passes the gate, b is assigned.
			h.clock.Step(5 * time.Second)
			pod.Status.Conditions = nil
			readyAt(true, h.clock.Now())(pod)
			if _, err := h.client.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			sync()
			if got := h.assigned(); strings.Join(got, ",") != "a,b" {
				t.Fatalf("assigned %v once a's pod is Ready again, want [a b]", got)
			}
			if !h.c.gated.passed("blue", "a", last.Status.CurrentRevision) {
				t.Error("a not remembered through the gate")
			}
		})
	}
}

// proveOn puts node as the cache would show it once it runs the pool's revision rev as last-known-good.
func proveOn(t *testing.T, h *harness, node, rev string) {
	t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system",
		Name: revision.SnapshotName("blue", rev), KubeletConfigKey: "kubelet", UID: "uid", ResourceVersion: "1"}}
	raw, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: src, Active: src, LastKnownGood: src})
	n.Annotations[nodeconfig.StatusAnnotation] = string(raw)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if err := h.nodes.Update(n); err != nil {
		t.Fatal(err)
	}
}

// TestPodsGatedForgetsNodesNoLongerSelected: a node deleted or relabelled leaves nothing behind in the
// gate's memory; the nodes still selected keep theirs.
func TestPodsGatedForgetsNodesNoLongerSelected(t *testing.T) {
	g := newPodsGated()
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	pods := []corev1.Pod{*workload("p", "a", at.Add(-time.Hour))}
	for _, n := range []string{"a", "gone"} {
		g.pass("blue", n, "r1")
		g.assigning("blue", n, "r2", pods)
		g.saw("blue", n, "r2", pods, at)
	}
	g.prune("blue", map[string]*corev1.Node{"a": {}})
	if !g.passed("blue", "a", "r1") || g.passed("blue", "gone", "r1") {
		t.Errorf("passed a %v, gone %v; want a kept, gone forgotten", g.passed("blue", "a", "r1"), g.passed("blue", "gone", "r1"))
	}
	for _, m := range []map[gateKey]map[types.UID]bool{g.live, g.notReady} {
		if _, ok := m[gateKey{"blue", "gone", "r2"}]; ok {
			t.Error("the gone node's pods are still remembered")
		}
		if _, ok := m[gateKey{"blue", "a", "r2"}]; !ok {
			t.Error("a's pods were forgotten")
		}
	}
}
