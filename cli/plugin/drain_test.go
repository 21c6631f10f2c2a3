// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// TestWaitApplied: what assign --drain takes for done, failed or not yet, from the node's status.
func TestWaitApplied(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "static", UID: "u",
		ResourceVersion: "7"}}
	version := func(rv string) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system",
			Name: "static", KubeletConfigKey: "kubelet", UID: "u", ResourceVersion: rv}}
	}
	for _, tc := range []struct {
		name   string
		cm     *corev1.ConfigMap // nil: the local config
		status *corev1.NodeConfigStatus
		err    string // a substring; "" for done
	}{
		{name: "runs it", cm: cm, status: &corev1.NodeConfigStatus{Assigned: version("7"), Active: version("7")}},
		{name: "rolled back", cm: cm, status: &corev1.NodeConfigStatus{Assigned: version("7"),
			Error: string(nodeconfig.HealthError)}, err: "node n1 failed kube-system/static: failed to run kubelet"},
		{name: "still refusing for want of the drain: not final", cm: cm, status: &corev1.NodeConfigStatus{
			Assigned: version("7"), Error: string(nodeconfig.DrainRequiredError)}, err: "did not report"},
		{name: "an error about an earlier version: not final", cm: cm, status: &corev1.NodeConfigStatus{
			Assigned: version("6"), Error: string(nodeconfig.HealthError)}, err: "did not report"},
		{name: "runs an earlier version: not yet", cm: cm, status: &corev1.NodeConfigStatus{Assigned: version("7"),
			Active: version("6")}, err: "did not report"},
		{name: "nothing reported", cm: cm, err: "did not report"},
		{name: "back on its local config", status: &corev1.NodeConfigStatus{}},
		{name: "local config refused", status: &corev1.NodeConfigStatus{Active: version("7"),
			Error: string(nodeconfig.ValidateError)}, err: "node n1 failed its local config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{}}}
			if tc.status != nil {
				raw, _ := json.Marshal(tc.status)
				n.Annotations[nodeconfig.StatusAnnotation] = string(raw)
			}
			var out bytes.Buffer
			o := &Options{io: genericiooptions.IOStreams{Out: &out, ErrOut: &out}, client: fake.NewClientset(n)}
			err := o.waitApplied(context.Background(), "n1", tc.cm, 100*time.Millisecond)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("waitApplied: %v, want %q", err, tc.err)
			}
		})
	}
}

// TestEvictionsOfUnreadableUsage: a node whose usage assign cannot read (here: a client without REST access
// for the stats summary) is one --drain drains (evictionsOf says why, unpredicted), and one plain assign
// warns about and leaves to its sidecar; a predicted eviction makes plain assign refuse, naming the pod and
// --drain. (The prediction from a real kubelet's stats, and the drain: TestANewEvictionThresholdWaitsForADrain.)
func TestEvictionsOfUnreadableUsage(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	var out bytes.Buffer
	o := &Options{io: genericiooptions.IOStreams{Out: &out, ErrOut: &out}, client: fake.NewClientset(n)}
	running := map[string]any{"evictionHard": map[string]any{"memory.available": "100Mi"}}
	next := map[string]any{"evictionHard": map[string]any{"memory.available": "2Gi"}}
	got := o.evictionsOf(context.Background(), n, running, next)
	if len(got.lines) != 0 || len(got.unread) != 1 || !strings.Contains(got.unread[0], "could not be checked") ||
		!strings.Contains(got.unread[0], "stats summary") {
		t.Errorf("evictionsOf = %+v, want one line saying the thresholds could not be checked", got)
	}
	if err := o.refuseEvictions("kube-system", "c", map[string]evictions{"n1": got}); err != nil {
		t.Errorf("assign without --drain refused a node whose usage it could not read (its sidecar reads it): %v", err)
	}
	if !strings.Contains(out.String(), "warning: node n1: its new eviction thresholds could not be checked") {
		t.Errorf("no warning for the unread node: %q", out.String())
	}
	predicted := evictions{lines: []string{"n1: web/a would be evicted (memory.available; it uses 1Gi)"}}
	if err := o.refuseEvictions("kube-system", "c", map[string]evictions{"n1": predicted}); err == nil ||
		!strings.Contains(err.Error(), "n1: web/a would be evicted") || !strings.Contains(err.Error(), "--drain") {
		t.Errorf("refuseEvictions = %v, want a refusal naming the pod and --drain", err)
	}
}

// TestAdmissionOf: a config whose maxPods is below the pods running on a node names the newest pods, which
// the restarted kubelet would reject, and plain assign refuses it; one with room names none; one on a node
// whose allocatable a flag sets is not predicted; one the kubelet would not start with is refused.
func TestAdmissionOf(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")},
		Allocatable: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")}}}
	objs := []runtime.Object{n}
	for i, name := range []string{"a", "b", "c"} {
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: name,
			CreationTimestamp: metav1.Unix(int64(i), 0)}, Spec: corev1.PodSpec{NodeName: "n1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	}
	var out bytes.Buffer
	o := &Options{io: genericiooptions.IOStreams{Out: &out, ErrOut: &out}, client: fake.NewClientset(objs...)}
	running := map[string]any{"maxPods": float64(110)}
	got := o.admissionOf(context.Background(), n, running, map[string]any{"maxPods": float64(2)})
	if len(got.lines) != 1 || len(got.unread) != 0 || got.lines[0] != "n1: web/c: pod 3 of 2 allowed (OutOfpods)" {
		t.Fatalf("admissionOf = %+v, want web/c rejected with OutOfpods", got)
	}
	if err := o.refuseEvictions("kube-system", "c", map[string]evictions{"n1": got}); err == nil ||
		!strings.Contains(err.Error(), "web/c") || !strings.Contains(err.Error(), "--drain") {
		t.Errorf("refuseEvictions = %v, want a refusal naming web/c and --drain", err)
	}
	if got := o.admissionOf(context.Background(), n, running, map[string]any{"maxPods": float64(3)}); len(got.lines)+len(got.unread) != 0 {
		t.Errorf("admissionOf with room for every pod = %+v, want nothing", got)
	}
	// A flag sets what the config does not say (the node's allocatable is not its running config's): no
	// prediction, which plain assign warns about and leaves to the sidecar.
	if got := o.admissionOf(context.Background(), n, map[string]any{"maxPods": float64(50)},
		map[string]any{"maxPods": float64(2)}); len(got.lines) != 0 || len(got.unread) != 1 ||
		!strings.Contains(got.unread[0], "a kubelet flag wins over the config") {
		t.Errorf("admissionOf on a node whose allocatable a flag sets = %+v, want it unread", got)
	}
	// Reservations over the capacity: the kubelet would not start, which plain assign refuses.
	n.Status.Capacity[corev1.ResourceMemory] = resource.MustParse("1Gi")
	if got := o.admissionOf(context.Background(), n, running, map[string]any{"maxPods": float64(110),
		"systemReserved": map[string]any{"memory": "2Gi"}}); len(got.lines) != 1 ||
		!strings.Contains(got.lines[0], "n1: the kubelet refuses to start") {
		t.Errorf("admissionOf with reservations over the capacity = %+v, want the refusal to start", got)
	}
}
