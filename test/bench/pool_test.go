// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

func TestPoolLimitOf(t *testing.T) {
	for _, tc := range []struct {
		v    intstr.IntOrString
		n    int
		want int
	}{
		{intstr.FromString("10%"), 2000, 200},
		{intstr.FromString("10%"), 2009, 200}, // rounds down
		{intstr.FromString("10%"), 5, 1},      // at least 1
		{intstr.FromString("10%"), 0, 1},
		{intstr.FromInt32(3), 2000, 3},
	} {
		got, err := poolLimitOf(tc.v, tc.n)
		if err != nil || got != tc.want {
			t.Errorf("poolLimitOf(%s, %d) = %d, %v; want %d", tc.v.String(), tc.n, got, err, tc.want)
		}
	}
	if _, err := poolLimitOf(intstr.FromString("ten"), 10); err == nil {
		t.Error("poolLimitOf(ten) succeeded")
	}
}

const (
	snapA = "bench-pool-aaaaaaaaaa"
	snapB = "bench-pool-bbbbbbbbbb"
)

func cmSource(name string) *corev1.NodeConfigSource {
	return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: namespace, Name: name, KubeletConfigKey: "kubelet"}}
}

// poolNode is a Node whose source annotation names source ("" none) and whose status shows active and
// last-known-good (nil: no status annotation at all).
func poolNode(name, source string, active, lkg *corev1.NodeConfigSource, withStatus bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	if source != "" {
		n.Annotations[nodeconfig.SourceAnnotation] = sourceAnnotation(source)
	}
	if withStatus {
		b, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: cmSource(source), Active: active, LastKnownGood: lkg})
		n.Annotations[nodeconfig.StatusAnnotation] = string(b)
	}
	return n
}

func TestNodeProgress(t *testing.T) {
	a := sourceKey(namespace, snapA, "kubelet")
	otherKey := cmSource(snapA)
	otherKey.ConfigMap.KubeletConfigKey = "other"
	otherNS := cmSource(snapA)
	otherNS.ConfigMap.Namespace = "default"
	spec := poolNode("n", cmShared, cmSource(cmShared), cmSource(cmShared), true) // proven on what the annotation names
	spec.Spec.ConfigSource = cmSource(snapA)
	for _, tc := range []struct {
		name           string
		node           *corev1.Node
		wantSource     string
		wantInProgress bool
	}{
		{"local config", poolNode("n", "", nil, nil, false), "", false},
		{"unreadable source", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{nodeconfig.SourceAnnotation: "{"}}}, "", false},
		{"assigned, no status yet", poolNode("n", snapA, nil, nil, false), a, true},
		{"assigned, status about the previous config", poolNode("n", snapA, cmSource(cmShared), cmSource(cmShared), true), a, true},
		{"active, in its trial", poolNode("n", snapA, cmSource(snapA), cmSource(cmShared), true), a, true},
		{"last-known-good, not active", poolNode("n", snapA, cmSource(cmShared), cmSource(snapA), true), a, true},
		{"proven", poolNode("n", snapA, cmSource(snapA), cmSource(snapA), true), a, false},
		{"proven on another key", poolNode("n", snapA, otherKey, otherKey, true), a, true},
		{"proven in another namespace", poolNode("n", snapA, otherNS, otherNS, true), a, true},
		{"unreadable status", func() *corev1.Node {
			n := poolNode("n", snapA, nil, nil, false)
			n.Annotations[nodeconfig.StatusAnnotation] = "{"
			return n
		}(), a, true},
		{"spec.configSource first", spec, a, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			source, inProgress := nodeProgress(tc.node)
			if source != tc.wantSource || inProgress != tc.wantInProgress {
				t.Errorf("nodeProgress = %q, %v; want %q, %v", source, inProgress, tc.wantSource, tc.wantInProgress)
			}
		})
	}
}

// TestInProgressCounter plays a rollout's Node changes, one at a time as a watch delivers them, and checks
// the counts after each and the most in progress over all of them.
func TestInProgressCounter(t *testing.T) {
	a, b := sourceKey(namespace, snapA, "kubelet"), sourceKey(namespace, snapB, "kubelet")
	shared := cmSource(cmShared)
	t0 := time.Unix(1000, 0)
	type counts struct{ assignedA, inProgressA, maxA, assignedB, inProgressB, maxB int }
	counter := newInProgressCounter()
	for i, step := range []struct {
		node   *corev1.Node
		forget string
		want   counts
	}{
		// Three nodes proven on the shared ConfigMap: nothing on the pool's snapshots.
		{node: poolNode("n1", cmShared, shared, shared, true)},
		{node: poolNode("n2", cmShared, shared, shared, true)},
		{node: poolNode("n3", cmShared, shared, shared, true)},
		// n1 and n2 assigned snapshot a; n1 restarts onto it, then is in its trial.
		{node: poolNode("n1", snapA, shared, shared, true), want: counts{1, 1, 1, 0, 0, 0}},
		{node: poolNode("n2", snapA, shared, shared, true), want: counts{2, 2, 2, 0, 0, 0}},
		{node: poolNode("n1", snapA, cmSource(snapA), shared, true), want: counts{2, 2, 2, 0, 0, 0}},
		// n1 proven: the next one (n3) assigned; never three at once.
		{node: poolNode("n1", snapA, cmSource(snapA), cmSource(snapA), true), want: counts{2, 1, 2, 0, 0, 0}},
		{node: poolNode("n3", snapA, shared, shared, true), want: counts{3, 2, 2, 0, 0, 0}},
		// The same state again (a resync) changes nothing.
		{node: poolNode("n3", snapA, shared, shared, true), want: counts{3, 2, 2, 0, 0, 0}},
		// n2 moves on to snapshot b before it proved a: it leaves a's counts.
		{node: poolNode("n2", snapB, shared, shared, true), want: counts{2, 1, 2, 1, 1, 1}},
		// n3 deleted, n2 leaves the pool's nodes.
		{forget: "n3", want: counts{1, 0, 2, 1, 1, 1}},
		{forget: "n2", want: counts{1, 0, 2, 0, 0, 1}},
		{forget: "gone", want: counts{1, 0, 2, 0, 0, 1}},
		// A node assigned later, one in progress: the most stays what it was.
		{node: poolNode("n4", snapA, shared, shared, true), want: counts{2, 1, 2, 0, 0, 1}},
	} {
		if step.node != nil {
			counter.observe(step.node, t0.Add(time.Duration(i)*time.Second))
		} else {
			counter.forget(step.forget)
		}
		sa, sb := counter.summary(a), counter.summary(b)
		got := counts{sa.assigned, sa.inProgress, sa.max, sb.assigned, sb.inProgress, sb.max}
		if got != step.want {
			t.Fatalf("after step %d: counts %+v, want %+v", i, got, step.want)
		}
	}
	if got, want := counter.summary(a).first, t0.Add(3*time.Second); !got.Equal(want) {
		t.Errorf("a first assigned at %v, want %v (step 3)", got, want)
	}
	if got, want := counter.summary(b).first, t0.Add(9*time.Second); !got.Equal(want) {
		t.Errorf("b first assigned at %v, want %v (step 9)", got, want)
	}
	if got := counter.eventCount(); got != 14 {
		t.Errorf("%d events, want 14", got)
	}
}
