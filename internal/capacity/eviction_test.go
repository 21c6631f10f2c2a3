// SPDX-License-Identifier: Apache-2.0

package capacity

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

const mi = 1 << 20

func TestEvictions(t *testing.T) {
	// The node: 4Gi of memory, 1.5Gi available; 100Gi of nodefs, 20Gi available.
	summary := func(pods ...statsapi.PodStats) *statsapi.Summary {
		u := func(v uint64) *uint64 { return &v }
		return &statsapi.Summary{
			Node: statsapi.NodeStats{
				Memory: &statsapi.MemoryStats{AvailableBytes: u(1536 * mi), WorkingSetBytes: u(2560 * mi)},
				Fs:     &statsapi.FsStats{AvailableBytes: u(20 << 30), CapacityBytes: u(100 << 30)},
			},
			Pods: pods,
		}
	}
	usage := func(name string, ws uint64) statsapi.PodStats {
		ws *= mi
		return statsapi.PodStats{PodRef: statsapi.PodReference{Name: name, Namespace: "default", UID: name + "-uid"},
			Memory: &statsapi.MemoryStats{WorkingSetBytes: &ws}}
	}
	pod := func(name string, requestMi int64, priority int32, mods ...func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")},
			Spec:   corev1.PodSpec{Priority: &priority, Containers: []corev1.Container{{Name: "c"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable}}
		if requestMi > 0 {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
				corev1.ResourceMemory: *resource.NewQuantity(requestMi*mi, resource.BinarySI)}
		}
		for _, m := range mods {
			m(&p)
		}
		return p
	}
	mirror := func(p *corev1.Pod) { p.Annotations = map[string]string{mirrorAnnotation: "x"} }
	bestEffort := func(p *corev1.Pod) { p.Status.QOSClass = corev1.PodQOSBestEffort }
	pods := []corev1.Pod{
		pod("best-effort", 0, 0), // uses 300Mi, over its request
		pod("within", 1024, 0),   // uses 500Mi of 1Gi requested
		pod("over-high", 100, 1000),
		pod("static", 0, 0, mirror), // critical: never evicted
		pod("no-stats", 0, 0),
	}
	// The same with best-effort's QoS class as the apiserver sets it: rejected under a hard threshold.
	withBestEffort := append([]corev1.Pod{pod("best-effort", 0, 0, bestEffort)}, pods[1:]...)
	stats := summary(usage("best-effort", 300), usage("within", 500), usage("over-high", 400), usage("static", 800))
	hard := func(kv ...string) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return map[string]any{"evictionHard": m}
	}
	for _, tc := range []struct {
		name          string
		running, next map[string]any
		summary       *statsapi.Summary
		pods          []corev1.Pod // default pods
		pressure      string       // signal/kind/already, comma-separated
		evicted       string       // pods, comma-separated
		short         string       // a substring
	}{
		{name: "a threshold below what is available: nothing", running: hard("memory.available", "100Mi"),
			next: hard("memory.available", "1Gi")},
		{name: "memory above the new threshold: the kubelet's order until it is met",
			running: hard("memory.available", "100Mi"), next: hard("memory.available", "2Gi"),
			// 512Mi to free: no stats first, then those over their requests by priority, then the rest
			pressure: "memory.available/hard/false", evicted: "no-stats,best-effort,over-high"},
		{name: "a percentage of capacity, and the minimum reclaim on top",
			running: hard("memory.available", "100Mi"),
			next: map[string]any{"evictionHard": map[string]any{"memory.available": "50%"}, // 2Gi of 4Gi
				"evictionMinimumReclaim": map[string]any{"memory.available": "300Mi"}},
			pressure: "memory.available/hard/false", evicted: "no-stats,best-effort,over-high,within"},
		{name: "crossed under the running config too, and no lower there: the kubelet evicts already",
			running: hard("memory.available", "1700Mi"), next: hard("memory.available", "1600Mi"),
			pressure: "memory.available/hard/true", evicted: "no-stats,best-effort"},
		{name: "crossed under the running config too, a higher threshold now: more to evict",
			running: hard("memory.available", "1600Mi"), next: hard("memory.available", "1700Mi"),
			pressure: "memory.available/hard/false", evicted: "no-stats,best-effort"},
		{name: "more than every evictable pod frees: what is missing", running: hard("memory.available", "100Mi"),
			next: hard("memory.available", "4000Mi"), pressure: "memory.available/hard/false",
			evicted: "no-stats,best-effort,over-high,within", short: "memory.available still 1264Mi below its hard threshold"},
		{name: "a soft threshold names the pods too", running: hard(),
			next:     map[string]any{"evictionSoft": map[string]any{"memory.available": "1600Mi"}},
			pressure: "memory.available/soft/false", evicted: "no-stats,best-effort"},
		{name: "hard and soft crossed: named once, as many as the larger need takes",
			running: hard(), next: map[string]any{"evictionHard": map[string]any{"memory.available": "1600Mi"},
				"evictionSoft": map[string]any{"memory.available": "2Gi"}},
			pressure: "memory.available/hard/false,memory.available/soft/false", evicted: "no-stats,best-effort,over-high"},
		{name: "BestEffort pods are rejected as the kubelet admits them again, the others ranked after",
			running: hard("memory.available", "100Mi"), next: hard("memory.available", "1600Mi"), pods: withBestEffort,
			pressure: "memory.available/hard/false", evicted: "best-effort(rejected)"},
		{name: "a soft threshold sets MemoryPressure at once: rejected too (only evictions wait for the grace period)",
			running: hard(), next: map[string]any{"evictionSoft": map[string]any{"memory.available": "1600Mi"}},
			pods: withBestEffort, pressure: "memory.available/soft/false", evicted: "best-effort(rejected)"},
		{name: "a BestEffort pod that tolerates the memory-pressure taint is admitted",
			running: hard("memory.available", "100Mi"), next: hard("memory.available", "1600Mi"),
			pods: append([]corev1.Pod{pod("best-effort", 0, 0, bestEffort, func(p *corev1.Pod) {
				p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeMemoryPressure,
					Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
			})}, pods[1:]...),
			pressure: "memory.available/hard/false", evicted: "no-stats,best-effort"},
		{name: "disk pressure: every pod but the critical may be rejected as the kubelet admits it again",
			running: hard("nodefs.available", "10%"), next: hard("nodefs.available", "25%"),
			pressure: "nodefs.available/hard/false",
			evicted:  "best-effort(rejected),within(rejected),over-high(rejected),no-stats(rejected)"},
		{name: "0% means no threshold", running: hard(), next: hard("nodefs.available", "0%")},
		{name: "no memory stats: no memory signal", running: hard(), next: hard("memory.available", "4Gi"),
			summary: &statsapi.Summary{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := stats
			if tc.summary != nil {
				s = tc.summary
			}
			in := pods
			if tc.pods != nil {
				in = tc.pods
			}
			e, err := Evictions(s, tc.running, tc.next, in)
			if err != nil {
				t.Fatal(err)
			}
			var pressure, evicted []string
			for _, p := range e.Pressure {
				already := "false"
				if p.Already {
					already = "true"
				}
				pressure = append(pressure, p.Signal+"/"+p.Kind+"/"+already)
			}
			for _, ev := range e.Evicted {
				name := strings.TrimPrefix(ev.Pod, "default/")
				if ev.Rejected != "" {
					name += "(rejected)"
				}
				evicted = append(evicted, name)
			}
			if got := strings.Join(pressure, ","); got != tc.pressure {
				t.Errorf("pressure %q, want %q", got, tc.pressure)
			}
			if got := strings.Join(evicted, ","); got != tc.evicted {
				t.Errorf("evicted %q, want %q", got, tc.evicted)
			}
			if got := strings.Join(e.Short, "; "); tc.short == "" && got != "" || !strings.Contains(got, tc.short) {
				t.Errorf("short %q, want %q", got, tc.short)
			}
		})
	}
}

func TestEvictionsRefuseABadThreshold(t *testing.T) {
	s := &statsapi.Summary{Node: statsapi.NodeStats{Fs: &statsapi.FsStats{AvailableBytes: new(uint64(1)),
		CapacityBytes: new(uint64(2))}}}
	_, err := Evictions(s, nil, map[string]any{"evictionHard": map[string]any{"nodefs.available": "ten%"}}, nil)
	if err == nil || !strings.Contains(err.Error(), `evictionHard nodefs.available "ten%"`) {
		t.Fatalf("err %v, want one naming the field, signal and value", err)
	}
}

func TestEvictionFindings(t *testing.T) {
	e := Eviction{
		Pressure: []Pressure{{Signal: "memory.available", Kind: "hard", Observed: "1536Mi", Threshold: "2Gi"},
			{Signal: "nodefs.available", Kind: "hard", Observed: "20Gi", Threshold: "25Gi", Already: true}},
		Evicted: []EvictedPod{{Pod: "default/web", Signal: "memory.available", Usage: "300Mi"},
			{Pod: "default/cache", Usage: "0", Rejected: "MemoryPressure"}},
	}
	got := strings.Join(e.Findings("node-2"), "\n")
	for _, want := range []string{
		"node-2: memory.available 1536Mi is below the new hard eviction threshold 2Gi",
		"node-2: nodefs.available 20Gi is below the new hard eviction threshold 25Gi (and below the running config's: the kubelet evicts already): the kubelet reports pressure",
		"node-2: default/web would be evicted (memory.available; it uses 300Mi)",
		"node-2: default/cache may be rejected (Evicted) when the restarted kubelet admits it again under MemoryPressure (it uses 0)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("findings\n%s\nlack %q", got, want)
		}
	}
}

func TestBestEffort(t *testing.T) {
	mem := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Mi")}
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want bool
	}{
		{"the status says so", corev1.Pod{Status: corev1.PodStatus{QOSClass: corev1.PodQOSBestEffort},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: mem}}}}}, true},
		{"the status says otherwise", corev1.Pod{Status: corev1.PodStatus{QOSClass: corev1.PodQOSBurstable}}, false},
		{"no status, no resources", corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{}}}}, true},
		{"no status, an init container's limit", corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{}},
			InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: mem}}}}}, false},
	} {
		if got := bestEffort(&tc.pod); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestStops: a restart stops pods only where some pod goes and some crossed signal is not crossed under the
// running thresholds already.
func TestStops(t *testing.T) {
	pod := []EvictedPod{{Pod: "web/a"}}
	for _, tc := range []struct {
		name string
		e    Eviction
		want bool
	}{
		{"nothing crossed", Eviction{}, false},
		{"crossed, no pod to stop", Eviction{Pressure: []Pressure{{Signal: "memory.available"}}}, false},
		{"crossed anew, a pod stopped", Eviction{Pressure: []Pressure{{Signal: "memory.available"}}, Evicted: pod}, true},
		{"crossed already", Eviction{Pressure: []Pressure{{Signal: "memory.available", Already: true}}, Evicted: pod}, false},
		{"one already, one anew", Eviction{Pressure: []Pressure{{Signal: "memory.available", Already: true},
			{Signal: "nodefs.available"}}, Evicted: pod}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.e.Stops(); got != tc.want {
				t.Errorf("Stops() = %v, want %v", got, tc.want)
			}
		})
	}
}
