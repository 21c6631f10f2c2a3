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
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// TestNodesWithoutASidecarAreHeld: a Windows node, a node labelled dkc.dev/sidecar=disabled and a node
// whose sidecar never reported are held (counted and listed, never patched) and take no slot; the free
// node is assigned. (Before, maxUnavailable 4 patched all four, and three of them timed out.)
func TestNodesWithoutASidecarAreHeld(t *testing.T) {
	pool := testPool()
	four := intstr.FromInt32(4)
	pool.Spec.MaxUnavailable = &four
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}),
		node("win", nil, map[string]string{"pool": "blue", corev1.LabelOSStable: "windows"}),
		node("off", nil, map[string]string{"pool": "blue", LabelSidecar: "disabled"}),
		unreported(node("new", nil, nil)),
		node("free", nil, map[string]string{"pool": "blue", corev1.LabelOSStable: "linux"}))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := h.assigned(); len(got) != 1 || got[0] != "free" {
		t.Errorf("assigned %v, want [free]", got)
	}
	st := h.pools.updates[len(h.pools.updates)-1].Status
	var held []string
	for _, n := range st.HeldNodes {
		held = append(held, n.Name+":"+n.Reason)
	}
	if st.Nodes.Held != 3 || strings.Join(held, ",") != "new:NotReported,off:NoSidecar,win:NoSidecar" {
		t.Errorf("held %d %v, want 3: new:NotReported, off:NoSidecar, win:NoSidecar", st.Nodes.Held, held)
	}
}

// TestAPoolOfNodesWithoutASidecarCompletes: with nothing it can assign, the pool settles (Updating False,
// NothingToAssign) instead of waiting for nodes that never answer.
func TestAPoolOfNodesWithoutASidecarCompletes(t *testing.T) {
	h := newHarness(t, testPool(), configMap(map[string]string{"kubelet": goodConfig}),
		node("win", nil, map[string]string{"pool": "blue", corev1.LabelOSStable: "windows"}),
		node("off", nil, map[string]string{"pool": "blue", LabelSidecar: "disabled"}))
	for range 2 {
		if _, err := h.c.sync(context.Background(), "blue"); err != nil {
			t.Fatal(err)
		}
		h.clock.Step(time.Hour)
	}
	if got := h.assigned(); len(got) != 0 {
		t.Errorf("assigned %v, want none", got)
	}
	st := h.pools.updates[len(h.pools.updates)-1].Status
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionUpdating); c == nil || c.Status != metav1.ConditionFalse ||
		c.Reason != v1alpha1.ReasonNothingToAssign {
		t.Errorf("Updating %+v, want False NothingToAssign", c)
	}
	if meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionHalted) || len(st.FailedNodes) > 0 {
		t.Errorf("halted or failed nodes %v, want neither", st.FailedNodes)
	}
}

// inProgressNode is a node the pool assigned revision rev of pool at 'at' that reported it is restarting
// onto it, still running r0.
func inProgressNode(name string, pool *v1alpha1.KubeletConfigPool, rev string, at time.Time) *corev1.Node {
	src := revision.Source(pool, rev)
	old := corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "blue-r0", UID: "u0", ResourceVersion: "1", KubeletConfigKey: "kubelet"}
	assigned := src
	assigned.UID, assigned.ResourceVersion = "u2", "2"
	st, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: &corev1.NodeConfigSource{ConfigMap: &assigned},
		Active: &corev1.NodeConfigSource{ConfigMap: &old}, LastKnownGood: &corev1.NodeConfigSource{ConfigMap: &old}})
	return node(name, map[string]string{
		nodeconfig.SourceAnnotation:   sourceJSON(src),
		nodeconfig.StatusAnnotation:   string(st),
		v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: rev, Time: metav1.Time{Time: at}}),
	}, nil)
}

// TestNodeTimeoutCountsFromTheTermStart: a node assigned two hours before this leader started (dkc-server
// was down meanwhile) is not failed at once: it gets nodeTimeout from the term's start, and is failed once
// that is over. A node whose status annotation is gone is never failed for a timeout. (Before, both were
// Timeout failures at the first sync, and the pool halted.)
func TestNodeTimeoutCountsFromTheTermStart(t *testing.T) {
	pool := testPool()
	two := intstr.FromInt32(2)
	pool.Spec.MaxUnavailable = &two
	maxFailures := int32(2)
	pool.Spec.MaxFailures = &maxFailures
	cm := configMap(map[string]string{"kubelet": goodConfig})
	rev, _ := revision.Snapshot(pool, cm)
	pool.Status.CurrentRevision = rev
	h := newHarness(t, pool, cm)
	start := h.clock.Now()
	for _, n := range []*corev1.Node{inProgressNode("a", pool, rev, start.Add(-2*time.Hour)),
		unreported(inProgressNode("lost", pool, rev, start.Add(-2*time.Hour)))} {
		if err := h.nodes.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	h.c.startTerm()

	sync := func() v1alpha1.KubeletConfigPoolStatus {
		t.Helper()
		if _, err := h.c.sync(context.Background(), "blue"); err != nil {
			t.Fatal(err)
		}
		return h.pools.updates[len(h.pools.updates)-1].Status
	}
	st := sync()
	if len(st.FailedNodes) != 0 || st.Nodes.InProgress != 2 {
		t.Fatalf("at the term's start: failed %v, %d in progress; want none failed, 2 in progress", st.FailedNodes, st.Nodes.InProgress)
	}
	h.clock.Step(29 * time.Minute)
	if st := sync(); len(st.FailedNodes) != 0 {
		t.Fatalf("29m into the term: failed %v, want none", st.FailedNodes)
	}
	h.clock.Step(time.Minute)
	st = sync()
	if len(st.FailedNodes) != 1 || st.FailedNodes[0].Name != "a" || st.FailedNodes[0].Reason != v1alpha1.FailureTimeout ||
		!strings.Contains(st.FailedNodes[0].Error, "when this dkc-server became leader") {
		t.Fatalf("30m into the term: failed %+v, want a (Timeout, counted from the term's start) only", st.FailedNodes)
	}
	if st.Nodes.InProgress != 1 {
		t.Errorf("%d in progress, want 1 (lost, waiting for a status)", st.Nodes.InProgress)
	}
}
