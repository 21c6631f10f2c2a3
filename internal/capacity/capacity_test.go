// SPDX-License-Identifier: Apache-2.0

package capacity

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestUnder: allocatable under a config is capacity less the reservations, the memory eviction
// threshold and the hugepages, pods the lower of maxPods and podsPerCore × CPUs; the node's pods are admitted
// again oldest first, and each that no longer fits is named with the resource, taking nothing from the pods
// after it — unless it is critical (it evicts others). Reservations over the capacity keep the kubelet from
// starting, and a node whose allocatable its running config does not explain gets no prediction.
func TestUnder(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(name string, age int, cpu, memory string) corev1.Pod {
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
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	done := pod("done", 5, "2", "")
	done.Status.Phase = corev1.PodSucceeded // finished: not admitted again
	terminating := pod("newest", 30, "", "")
	terminating.DeletionTimestamp = &metav1.Time{Time: t0} // not stopped yet: admitted again
	mirror := pod("static", 40, "", "")
	mirror.Annotations = map[string]string{mirrorAnnotation: "x"}
	pods := []corev1.Pod{terminating, pod("oldest", 10, "500m", "1Gi"), pod("middle", 20, "1500m", ""), done}
	running := map[string]any{"maxPods": float64(110), "evictionHard": map[string]any{"memory.available": "100Mi"}}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	with := func(cfg map[string]any) map[string]any {
		out := map[string]any{}
		for k, v := range running {
			out[k] = v
		}
		for k, v := range cfg {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		capacity    corev1.ResourceList
		next        map[string]any
		pods        []corev1.Pod
		flagged     bool                           // the node's allocatable is not its running config's
		want        map[corev1.ResourceName]string // new allocatable
		wantUnfit   []string                       // "pod resource"
		notStarting string
	}{
		{name: "unchanged", next: running,
			want: map[corev1.ResourceName]string{corev1.ResourcePods: "110", corev1.ResourceCPU: "2", corev1.ResourceMemory: "8092Mi"}},
		{name: "maxPods below the pods", next: with(map[string]any{"maxPods": float64(2)}),
			want: map[corev1.ResourceName]string{corev1.ResourcePods: "2"}, wantUnfit: []string{"default/newest pods"}},
		{name: "podsPerCore lower than maxPods", next: with(map[string]any{"podsPerCore": float64(1)}),
			want: map[corev1.ResourceName]string{corev1.ResourcePods: "2"}, wantUnfit: []string{"default/newest pods"}},
		{name: "reserved CPU", next: with(map[string]any{"systemReserved": map[string]any{"cpu": "250m"},
			"kubeReserved": map[string]any{"cpu": "250m"}}),
			want: map[corev1.ResourceName]string{corev1.ResourceCPU: "1500m"}, wantUnfit: []string{"default/middle cpu"}},
		{name: "reserved CPUs", next: with(map[string]any{"reservedSystemCPUs": "0"}),
			want: map[corev1.ResourceName]string{corev1.ResourceCPU: "1"}, wantUnfit: []string{"default/middle cpu"}},
		{name: "a critical pod over the limit evicts others", next: with(map[string]any{"maxPods": float64(3)}),
			pods: append(pods[:len(pods):len(pods)], mirror), wantUnfit: []string{"default/static pods preempts"}},
		{name: "a memory threshold as a percentage", next: with(map[string]any{"evictionHard": map[string]any{"memory.available": "50%"}}),
			want: map[corev1.ResourceName]string{corev1.ResourceMemory: "4Gi"}},
		{name: "100% is no threshold", next: with(map[string]any{"evictionHard": map[string]any{"memory.available": "100%"}}),
			want: map[corev1.ResourceName]string{corev1.ResourceMemory: "8Gi"}},
		{name: "hugepages are not allocatable memory", next: running,
			capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi"),
				corev1.ResourcePods: resource.MustParse("110"), "hugepages-2Mi": resource.MustParse("1Gi")},
			want: map[corev1.ResourceName]string{corev1.ResourceMemory: "7068Mi"}},
		{name: "reservations over the capacity", next: with(map[string]any{"kubeReserved": map[string]any{"memory": "9Gi"}}),
			notStarting: "memory reserved"},
		{name: "a flag the config does not show", next: with(map[string]any{"maxPods": float64(2)}), flagged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.capacity == nil {
				tc.capacity = capacity
			}
			if tc.pods == nil {
				tc.pods = pods
			}
			now, err := allocatableUnder(tc.capacity, running)
			if err != nil {
				t.Fatal(err)
			}
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{Capacity: tc.capacity,
				Allocatable: now.list}}
			if tc.flagged {
				node.Status.Allocatable = node.Status.Allocatable.DeepCopy()
				node.Status.Allocatable[corev1.ResourcePods] = resource.MustParse("30") // --max-pods=30
			}
			c, err := Under(node, running, tc.next, tc.pods)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range c.Resources {
				if want, ok := tc.want[r.Resource]; ok {
					if got := resource.MustParse(r.Next); got.Cmp(resource.MustParse(want)) != 0 {
						t.Errorf("%s under the config: %s, want %s", r.Resource, r.Next, want)
					}
				}
				if r.Resource == corev1.ResourcePods && tc.pods[len(tc.pods)-1].Name != "static" && r.Requested != "3" {
					t.Errorf("pods requested %s, want 3 (the finished one not counted, the terminating one counted)", r.Requested)
				}
			}
			if tc.notStarting != "" {
				if !strings.Contains(c.NotStarting, tc.notStarting) || len(c.Unfit) != 0 {
					t.Errorf("not starting %q, unfit %v; want %q and no pod named", c.NotStarting, c.Unfit, tc.notStarting)
				}
				return
			}
			if tc.flagged != (c.Unpredicted != "") {
				t.Errorf("unpredicted %q, want it set: %v", c.Unpredicted, tc.flagged)
			}
			var got []string
			for _, u := range c.Unfit {
				g := u.Pod + " " + string(u.Resource)
				if u.Preempts {
					g += " preempts"
				}
				got = append(got, g)
				if !strings.Contains(u.Reason, "OutOf"+string(u.Resource)) {
					t.Errorf("reason %q does not name OutOf%s", u.Reason, u.Resource)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantUnfit, ",") {
				t.Errorf("unfit %v, want %v", got, tc.wantUnfit)
			}
		})
	}
	if _, err := allocatableUnder(capacity, map[string]any{"kubeReserved": map[string]any{"cpu": "lots"}}); err == nil ||
		!strings.Contains(err.Error(), `kubeReserved.cpu "lots"`) {
		t.Errorf("a reservation that does not parse: %v", err)
	}
}

// TestCritical: what the kubelet never evicts and admits first — static pods as the kubelet's own /pods
// lists them (their source annotation), their mirrors as the apiserver has them, and critical priorities.
func TestCritical(t *testing.T) {
	high := int32(systemCriticalPriority)
	low := int32(1000)
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		priority    *int32
		want        bool
	}{
		{name: "a pod from the apiserver", want: false},
		{name: "a pod the kubelet got from the apiserver", annotations: map[string]string{sourceAnnotation: "api"}, want: false},
		{name: "a static pod from a file, as the kubelet lists it", annotations: map[string]string{sourceAnnotation: "file"}, want: true},
		{name: "a static pod from a URL", annotations: map[string]string{sourceAnnotation: "http"}, want: true},
		{name: "a mirror pod", annotations: map[string]string{mirrorAnnotation: "x", sourceAnnotation: "api"}, want: true},
		{name: "system-node-critical", priority: &high, want: true},
		{name: "a low priority", priority: &low, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}, Spec: corev1.PodSpec{Priority: tc.priority}}
			if got := critical(p); got != tc.want {
				t.Errorf("critical = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestOnRestart: with the running config as the kubelet runs it (flags applied), the allocatable now is what
// that config leaves of the capacity — a --max-pods flag shows in it, so the prediction is made, not refused
// as Unpredicted — and the pods are admitted against what the next config leaves.
func TestOnRestart(t *testing.T) {
	capacity := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi")}
	pods := make([]corev1.Pod, 3)
	for i := range pods {
		pods[i] = corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: string(rune('a' + i)),
			CreationTimestamp: metav1.Unix(int64(i), 0)}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	running := map[string]any{"maxPods": float64(50)} // e.g. --max-pods=50
	got, err := OnRestart("node-1", capacity, running, map[string]any{"maxPods": float64(2),
		"systemReserved": map[string]any{"cpu": "1"}}, pods)
	if err != nil {
		t.Fatal(err)
	}
	if got.Unpredicted != "" || len(got.Unfit) != 1 || got.Unfit[0].Pod != "web/c" ||
		got.Unfit[0].Resource != corev1.ResourcePods {
		t.Fatalf("OnRestart = %+v, want web/c rejected for pods, predicted", got)
	}
	want := []ResourceFit{{Resource: "pods", Now: "50", Next: "2", Requested: "3"},
		{Resource: "cpu", Now: "4", Next: "3", Requested: "-"}, {Resource: "memory", Now: "8Gi", Next: "8Gi", Requested: "-"}}
	for i, w := range want {
		if got.Resources[i] != w {
			t.Errorf("resource %d: %+v, want %+v", i, got.Resources[i], w)
		}
	}
	if _, err := OnRestart("node-1", capacity, map[string]any{"kubeReserved": map[string]any{"cpu": "x"}}, running, pods); err == nil ||
		!strings.Contains(err.Error(), "node node-1") {
		t.Errorf("a running config that does not parse: %v, want an error naming the node", err)
	}
}

// TestDrainKeeps: a drain leaves DaemonSet pods and static pods (mirrors, or as the kubelet lists them) and
// takes the rest, a pod a DaemonSet owns without controlling it included.
func TestDrainKeeps(t *testing.T) {
	yes, no := true, false
	pods := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "daemon", OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Controller: &yes}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mirror", Annotations: map[string]string{mirrorAnnotation: "x"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "static", Annotations: map[string]string{sourceAnnotation: "file"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "api", Annotations: map[string]string{sourceAnnotation: "api"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "replica", OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Controller: &yes}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "adopted", OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Controller: &no}}}},
	}
	var got []string
	for _, p := range DrainKeeps(pods) {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != "daemon,mirror,static" {
		t.Errorf("DrainKeeps = %v, want daemon, mirror, static", got)
	}
}
