// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCapacityUnder: allocatable under a config is capacity less the reservations and the memory eviction
// threshold, pods the lower of maxPods and podsPerCore × CPUs; the node's pods are admitted again oldest
// first, and each one that no longer fits is named with the resource, taking nothing from the pods after it.
func TestCapacityUnder(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(name string, age int, cpu, memory string, phase corev1.PodPhase) corev1.Pod {
		req := corev1.ResourceList{}
		if cpu != "" {
			req[corev1.ResourceCPU] = resource.MustParse(cpu)
		}
		if memory != "" {
			req[corev1.ResourceMemory] = resource.MustParse(memory)
		}
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: req}}}},
			Status:     corev1.PodStatus{Phase: phase},
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{
		Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
			corev1.ResourcePods: resource.MustParse("110")},
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("7900Mi"),
			corev1.ResourcePods: resource.MustParse("110")},
	}}
	pods := []corev1.Pod{
		pod("newest", 30, "", "", corev1.PodRunning),
		pod("oldest", 10, "1", "1Gi", corev1.PodRunning),
		pod("middle", 20, "2500m", "", corev1.PodPending),
		pod("done", 5, "3", "", corev1.PodSucceeded), // finished: not admitted again
	}
	for _, tc := range []struct {
		name      string
		cfg       map[string]any
		want      map[corev1.ResourceName]string // new allocatable
		wantUnfit []string                       // "pod resource"
	}{
		{name: "defaults", cfg: map[string]any{"maxPods": float64(110), "evictionHard": map[string]any{"memory.available": "100Mi"}},
			want: map[corev1.ResourceName]string{corev1.ResourcePods: "110", corev1.ResourceCPU: "4", corev1.ResourceMemory: "8092Mi"}},
		{name: "maxPods below the pods", cfg: map[string]any{"maxPods": float64(2)},
			want: map[corev1.ResourceName]string{corev1.ResourcePods: "2"}, wantUnfit: []string{"default/newest pods"}},
		{name: "podsPerCore lower than maxPods", cfg: map[string]any{"maxPods": float64(110), "podsPerCore": float64(0.5)},
			want: map[corev1.ResourceName]string{corev1.ResourcePods: "2"}, wantUnfit: []string{"default/newest pods"}},
		{name: "reserved CPU", cfg: map[string]any{"maxPods": float64(110), "systemReserved": map[string]any{"cpu": "500m"},
			"kubeReserved": map[string]any{"cpu": "500m"}},
			want: map[corev1.ResourceName]string{corev1.ResourceCPU: "3"}, wantUnfit: []string{"default/middle cpu"}},
		{name: "memory threshold as a percentage", cfg: map[string]any{"maxPods": float64(110),
			"evictionHard": map[string]any{"memory.available": "90%"}, "kubeReserved": map[string]any{"memory": "1Gi"}},
			want: map[corev1.ResourceName]string{corev1.ResourceMemory: "0"}, wantUnfit: []string{"default/oldest memory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := CapacityUnder(node, tc.cfg, pods)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range c.Resources {
				if want, ok := tc.want[r.Resource]; ok {
					if got := resource.MustParse(r.Next); got.Cmp(resource.MustParse(want)) != 0 {
						t.Errorf("%s under the config: %s, want %s", r.Resource, r.Next, want)
					}
				}
				if r.Resource == corev1.ResourcePods && r.Requested != "3" {
					t.Errorf("pods requested %s, want 3 (the finished one not counted)", r.Requested)
				}
			}
			var got []string
			for _, u := range c.Unfit {
				got = append(got, u.Pod+" "+string(u.Resource))
				if !strings.Contains(u.Reason, "OutOf"+string(u.Resource)) {
					t.Errorf("reason %q does not name OutOf%s", u.Reason, u.Resource)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantUnfit, ",") {
				t.Errorf("unfit %v, want %v", got, tc.wantUnfit)
			}
		})
	}
	if _, err := CapacityUnder(node, map[string]any{"kubeReserved": map[string]any{"cpu": "lots"}}, nil); err == nil ||
		!strings.Contains(err.Error(), `kubeReserved.cpu "lots"`) {
		t.Errorf("a reservation that does not parse: %v", err)
	}
}
