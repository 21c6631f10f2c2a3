// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// hungryNode is a node with 1Gi of memory available out of 4Gi, running BestEffort pod web/hungry, which
// uses 100Mi.
func hungryNode() (*statsapi.Summary, []corev1.Pod) {
	gi := func(n float64) *uint64 { v := uint64(n * (1 << 30)); return &v }
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "hungry", UID: types.UID("p1")},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBestEffort}}
	return &statsapi.Summary{
		Node: statsapi.NodeStats{NodeName: "node-1", Memory: &statsapi.MemoryStats{AvailableBytes: gi(1), WorkingSetBytes: gi(3)}},
		Pods: []statsapi.PodStats{{PodRef: statsapi.PodReference{Namespace: "web", Name: "hungry", UID: "p1"},
			Memory: &statsapi.MemoryStats{WorkingSetBytes: gi(0.1)}}},
	}, []corev1.Pod{pod}
}

// TestEvictionsWaitForADrain: a config whose eviction thresholds the node's usage crosses is not restarted
// into while the node is not drained for it — the kubelet would evict its pods at once, past their
// budgets — and the status names them; drained, the kubelet restarts into it (no state to remove). A
// prediction that cannot be made, or that finds nothing to evict or only what the running thresholds evict
// already, restarts as always.
func TestEvictionsWaitForADrain(t *testing.T) {
	const high = cfgHeader + "evictionHard:\n  memory.available: 2Gi\n"
	tests := []struct {
		name string
		// running is the local config (eventRecordQPS: 50 when "").
		running    string
		assigned   string
		noStats    bool
		wantDrain  bool
		wantDetail []string
	}{
		{name: "new threshold above what is available", assigned: high, wantDrain: true,
			wantDetail: []string{"node-1: memory.available 1Gi is below the new hard eviction threshold 2Gi",
				"web/hungry", "honours no PodDisruptionBudget",
				"kubectl dkc assign node-1 --configmap kube-system/c --key kubelet --drain"}},
		{name: "new threshold below what is available", assigned: cfgHeader + "evictionHard:\n  memory.available: 512Mi\n"},
		{name: "stats not readable", assigned: high, noStats: true},
		{name: "thresholds unchanged", assigned: cfgHeader + "eventRecordQPS: 40\n"},
		{name: "running thresholds crossed already and higher", running: cfgHeader + "evictionHard:\n  memory.available: 3Gi\n",
			assigned: high},
		{name: "running thresholds crossed already but lower", running: cfgHeader + "evictionHard:\n  memory.available: 1500Mi\n",
			assigned: high, wantDrain: true, wantDetail: []string{"web/hungry"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			n.agent.cfg.NodeName = "node-1"
			if tt.running != "" {
				// What the kubelet runs (the fake reads its file at each /configz).
				if err := os.WriteFile(n.local, []byte(tt.running), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if !tt.noStats {
				n.kubelet.summary, n.kubelet.pods = hungryNode()
			}
			n.applyDrained(assignment("u", "1", tt.assigned), false)
			if !tt.wantDrain {
				n.expect("1", "1", "local", "", 1)
				n.checkCalls("restart 1")
				return
			}
			waitsForDrain(t, n, tt.wantDetail)
			if f := n.agent.state.failure(n.mustAssigned()); f != "" {
				t.Errorf("the config was marked failed: %s", f)
			}
			n.applyDrained(assignment("u", "1", tt.assigned), true)
			n.expect("1", "1", "local", "", 1)
			n.checkCalls("restart 1")
		})
	}
}

// TestFallbackWaitsForNoDrain: a node runs a config that then fails, while its local config would stop
// pods the failed config does not — its usage crosses the local eviction thresholds, or its pods exceed the
// local maxPods: the rollback to the local config restarts the kubelet at once; the way back never waits
// for a drain.
func TestFallbackWaitsForNoDrain(t *testing.T) {
	for _, tc := range []struct {
		name, local, assigned string
	}{
		{name: "evictions", local: cfgHeader + "evictionHard:\n  memory.available: 2Gi\n",
			assigned: cfgHeader + "evictionHard:\n  memory.available: 100Mi\nmaxPods: 13\n"},
		{name: "admission", local: cfgHeader + "maxPods: 1\n", assigned: cfgHeader + "maxPods: 13\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.agent.cfg.NodeName = "node-1"
			n.agent.setCapacity(map[string]string{"pods": "110", "cpu": "4", "memory": "4Gi"})
			if err := os.WriteFile(n.local, []byte(tc.local), 0o644); err != nil {
				t.Fatal(err)
			}
			n.kubelet.summary, n.kubelet.pods = hungryNode()
			newer := n.kubelet.pods[0]
			newer.Name, newer.UID, newer.CreationTimestamp = "newer", "p2", metav1.Unix(2000, 0)
			n.kubelet.pods = append(n.kubelet.pods, newer)
			// Never healthy (maxPods 13).
			n.applyDrained(assignment("u", "1", tc.assigned), false)
			n.expect("1", "local", "local", string(nodeconfig.HealthError), 2)
			if n.agent.phase == PhaseWaitingForDrain {
				t.Errorf("phase %s: the rollback waits for a drain", n.agent.phase)
			}
		})
	}
}

// TestAdmissionWaitsForADrain: a config that leaves less room than the node's running pods take is not
// restarted into while the node is not drained for it — the restarted kubelet would admit the pods again,
// oldest first, and fail the newest with OutOfpods or OutOfcpu — and the status names them; drained, the
// kubelet restarts into it. Without the Node's capacity from the service, or without the pods, nothing is
// predicted, and a config that leaves room restarts as always. A static pod is critical: one that does not
// fit is admitted by evicting lower-priority pods, which holds the node as much.
func TestAdmissionWaitsForADrain(t *testing.T) {
	pod := func(name string, age int, cpu string, static bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: name, UID: types.UID(name),
			CreationTimestamp: metav1.Unix(int64(1000+age), 0)},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if cpu != "" {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
		}
		if static {
			p.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
		}
		return p
	}
	// The static pod is the newest, as the sidecar's own (system-node-critical) pod is after a rollout.
	pods := []corev1.Pod{pod("a", 1, "1", false), pod("b", 2, "1", false), pod("c", 3, "1", false),
		pod("static", 4, "", true)}
	yes := true // b is a DaemonSet's: a drain leaves it, as it leaves the static pod
	pods[1].OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: &yes}}
	capacity := map[string]string{"pods": "110", "cpu": "4", "memory": "8Gi"}
	tests := []struct {
		name       string
		assigned   string
		capacity   map[string]string
		noPods     bool
		wantDrain  bool
		wantDetail []string
	}{
		{name: "maxPods below the pods running", assigned: cfgHeader + "maxPods: 2\n", capacity: capacity,
			wantDrain: true, wantDetail: []string{"would stop 2 of them", "web/c: pod 3 of 2 allowed (OutOfpods)",
				"web/static: critical, pod 3 of 2 allowed (OutOfpods): the kubelet evicts lower-priority pods",
				"kubectl dkc assign node-1 --configmap kube-system/c --key kubelet --drain"}},
		{name: "a CPU reservation the running pods do not leave", assigned: cfgHeader + "systemReserved:\n  cpu: \"2\"\n",
			capacity: capacity, wantDrain: true,
			wantDetail: []string{"would stop 1 of them", "web/c: requests 1 of cpu, 0 left (OutOfcpu)"}},
		{name: "only the newest and critical pod over maxPods evicts another", assigned: cfgHeader + "maxPods: 3\n",
			capacity: capacity, wantDrain: true, wantDetail: []string{"would stop 1 of them", "web/static: critical"}},
		{name: "too little room even for the pods a drain leaves", assigned: cfgHeader + "maxPods: 1\n", capacity: capacity,
			wantDrain: true, wantDetail: []string{"would stop 3 of them",
				"(even drained, it would not admit web/static: critical, pod 2 of 1 allowed (OutOfpods)"}},
		{name: "room for every pod", assigned: cfgHeader + "maxPods: 4\n", capacity: capacity},
		{name: "capacity not sent", assigned: cfgHeader + "maxPods: 2\n"},
		{name: "pods not readable", assigned: cfgHeader + "maxPods: 2\n", capacity: capacity, noPods: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			n.agent.cfg.NodeName = "node-1"
			if tt.capacity != nil {
				n.agent.setCapacity(tt.capacity)
			}
			if !tt.noPods {
				n.kubelet.summary, n.kubelet.pods = &statsapi.Summary{}, pods
			}
			n.applyDrained(assignment("u", "1", tt.assigned), false)
			if !tt.wantDrain {
				n.expect("1", "1", "local", "", 1)
				n.checkCalls("restart 1")
				return
			}
			tight := strings.Contains(tt.assigned, "maxPods: 1\n")
			if detail := waitsForDrain(t, n, tt.wantDetail); !tight &&
				(strings.Contains(detail, "web/a:") || strings.Contains(detail, "web/b:")) {
				t.Errorf("detail %q names a pod the kubelet admits first", detail)
			} else if strings.Contains(detail, "even drained") != tight {
				t.Errorf("detail %q: whether a drain makes room, wrong", detail)
			}
			n.applyDrained(assignment("u", "1", tt.assigned), true)
			n.expect("1", "1", "local", "", 1)
			n.checkCalls("restart 1")
		})
	}
}

// waitsForDrain checks that n's assignment "1" waits for a drain — not applied, the kubelet not restarted,
// status DrainRequired with a detail naming each of want, no retry at the ticks — and returns the detail.
func waitsForDrain(t *testing.T, n *node, want []string) string {
	t.Helper()
	n.expect("1", "local", "local", string(nodeconfig.DrainRequiredError), 0)
	n.checkCalls()
	_, detail := n.agent.Status()
	for _, w := range want {
		if !strings.Contains(detail, w) {
			t.Errorf("detail %q does not say %q", detail, w)
		}
	}
	if n.agent.phase != PhaseWaitingForDrain || n.agent.retry {
		t.Errorf("phase %s, retry %v; want %s, no retry at the ticks", n.agent.phase, n.agent.retry, PhaseWaitingForDrain)
	}
	return detail
}
