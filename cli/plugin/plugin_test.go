package plugin

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name          string
		running, next map[string]any
		want          []FieldChange
	}{
		{"identical", map[string]any{"kind": "KubeletConfiguration", "eventRecordQPS": 5.0}, map[string]any{"kind": "KubeletConfiguration", "eventRecordQPS": 5.0}, nil},
		{"apiVersion and kind are not fields", map[string]any{"apiVersion": "a", "kind": "b"}, map[string]any{"apiVersion": "c", "kind": "d"}, nil},
		{"changed, sorted by field, with safety",
			map[string]any{"maxPods": 110.0, "eventRecordQPS": 5.0},
			map[string]any{"maxPods": 50.0, "eventRecordQPS": 7.0},
			[]FieldChange{
				{Field: "eventRecordQPS", Running: 5.0, New: 7.0, Safety: RestartSafe},
				{Field: "maxPods", Running: 110.0, New: 50.0, Safety: Disruptive, Reason: "lowering it below the running pods rejects pods on the next admission"},
			}},
		{"added and removed fields",
			map[string]any{"staticPodPath": "/etc/kubernetes/manifests"},
			map[string]any{"cpuManagerPolicy": "static"},
			[]FieldChange{
				{Field: "cpuManagerPolicy", Running: nil, New: "static", Safety: NeedsReset, Reason: fieldSafety["cpuManagerPolicy"].reason},
				{Field: "staticPodPath", Running: "/etc/kubernetes/manifests", New: nil, Safety: Disruptive, Reason: fieldSafety["staticPodPath"].reason},
			}},
		{"nested values compared whole",
			map[string]any{"evictionHard": map[string]any{"memory.available": "100Mi"}},
			map[string]any{"evictionHard": map[string]any{"memory.available": "200Mi"}},
			[]FieldChange{{Field: "evictionHard", Running: map[string]any{"memory.available": "100Mi"}, New: map[string]any{"memory.available": "200Mi"},
				Safety: Disruptive, Reason: fieldSafety["evictionHard"].reason}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Diff(tc.running, tc.next); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Diff = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestSafety(t *testing.T) {
	for _, tc := range []struct{ field, class string }{
		{"eventRecordQPS", RestartSafe},
		{"cpuManagerPolicy", NeedsReset},
		{"authorization", Disruptive},
		{"aFieldNobodyClassified", RestartSafe}, // most fields take effect on the restart applying is
	} {
		if class, reason := Safety(tc.field); class != tc.class || (class != RestartSafe && reason == "") {
			t.Errorf("Safety(%q) = %q, %q; want %q with a reason unless restart-safe", tc.field, class, reason, tc.class)
		}
	}
}

func node(annotations map[string]string, conditions ...corev1.NodeCondition) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: annotations}, Status: corev1.NodeStatus{Conditions: conditions}}
}

func TestStatusOf(t *testing.T) {
	at := metav1.Unix(1700000000, 0)
	ok := corev1.NodeCondition{Type: nodeconfig.ConditionType, Status: corev1.ConditionTrue, Message: "using current", LastTransitionTime: at}
	status := `{"assigned":{"configMap":{"namespace":"kube-system","name":"c","uid":"u","resourceVersion":"7","kubeletConfigKey":"kubelet"}},"error":"boom"}`
	for _, tc := range []struct {
		name string
		n    *corev1.Node
		want NodeStatus
	}{
		{"nothing reported", node(nil), NodeStatus{Node: "n1"}},
		{"unparseable annotation is not a report", node(map[string]string{nodeconfig.StatusAnnotation: "{"}), NodeStatus{Node: "n1"}},
		{"status and condition", node(map[string]string{nodeconfig.StatusAnnotation: status}, ok), NodeStatus{Node: "n1", Reported: true,
			Status: &corev1.NodeConfigStatus{Assigned: &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{
				Namespace: "kube-system", Name: "c", UID: "u", ResourceVersion: "7", KubeletConfigKey: "kubelet"}}, Error: "boom"},
			ConfigOK: "True", Message: "using current", Transited: &at}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StatusOf(tc.n); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("StatusOf = %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestNodeDone(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "c", UID: types.UID("u"), ResourceVersion: "7"}}
	src := func(uid, rv string) string {
		return `{"configMap":{"namespace":"kube-system","name":"c","uid":"` + uid + `","resourceVersion":"` + rv + `","kubeletConfigKey":"kubelet"}}`
	}
	st := func(assigned, active, errText string) map[string]string {
		return map[string]string{nodeconfig.StatusAnnotation: `{"assigned":` + assigned + `,"active":` + active + `,"error":"` + errText + `"}`}
	}
	configOK := corev1.NodeCondition{Type: nodeconfig.ConditionType, Status: corev1.ConditionTrue}
	configBad := corev1.NodeCondition{Type: nodeconfig.ConditionType, Status: corev1.ConditionFalse, Message: "using last-known-good"}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	notReady := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse}
	for _, tc := range []struct {
		name       string
		n          *corev1.Node
		done       bool
		failedText string
	}{
		{"not reported yet", node(nil, ready), false, ""},
		{"running it, ConfigOK, Ready", node(st(src("u", "7"), src("u", "7"), ""), configOK, ready), true, ""},
		{"running it but not Ready", node(st(src("u", "7"), src("u", "7"), ""), configOK, notReady), false, ""},
		{"running an older version", node(st(src("u", "6"), src("u", "6"), ""), configOK, ready), false, ""},
		{"a ConfigMap of the same name, re-created", node(st(src("u2", "7"), src("u2", "7"), ""), configOK, ready), false, ""},
		{"refused it", node(st(src("u", "7"), src("u", "6"), "failed to validate config"), configBad, ready), false, "failed to validate config: using last-known-good"},
		{"an error about an older assignment is not this rollout's failure", node(st(src("u", "6"), src("u", "5"), "failed to validate config"), configBad, ready), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, failed := nodeDone(tc.n, cm, "kubelet")
			if done != tc.done || failed != tc.failedText {
				t.Errorf("nodeDone = %v, %q; want %v, %q", done, failed, tc.done, tc.failedText)
			}
		})
	}
}

func TestBatchSize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		max      intstr.IntOrString
		selected int
		size     int
		wantErr  bool
	}{
		{"a number", intstr.FromInt32(3), 10, 3, false},
		{"a percentage rounds down", intstr.FromString("25%"), 10, 2, false},
		{"never less than one", intstr.FromString("10%"), 5, 1, false},
		{"zero means one", intstr.FromInt32(0), 5, 1, false},
		{"not a number or percentage", intstr.FromString("many"), 5, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size, err := batchSize(tc.max, tc.selected)
			if (err != nil) != tc.wantErr || size != tc.size {
				t.Errorf("batchSize(%v, %d) = %d, %v; want %d (error %v)", tc.max.String(), tc.selected, size, err, tc.size, tc.wantErr)
			}
		})
	}
}

func TestBatches(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	for _, tc := range []struct {
		size int
		want [][]string
	}{
		{1, [][]string{{"a"}, {"b"}, {"c"}, {"d"}, {"e"}}},
		{2, [][]string{{"a", "b"}, {"c", "d"}, {"e"}}},
		{5, [][]string{{"a", "b", "c", "d", "e"}}},
		{9, [][]string{{"a", "b", "c", "d", "e"}}},
		{0, [][]string{{"a"}, {"b"}, {"c"}, {"d"}, {"e"}}},
	} {
		if got := batches(nodes, tc.size); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("batches(size %d) = %v, want %v", tc.size, got, tc.want)
		}
	}
	if got := batches([]string{}, 3); len(got) != 0 {
		t.Errorf("batches of nothing = %v, want none", got)
	}
}

func TestParseConfigMap(t *testing.T) {
	for _, tc := range []struct {
		ref, ns, name string
		ok            bool
	}{
		{"kube-system/c", "kube-system", "c", true},
		{"c", "", "", false},
		{"/c", "", "", false},
		{"kube-system/", "", "", false},
		{"a/b/c", "", "", false},
	} {
		ns, name, err := parseConfigMap(tc.ref)
		if (err == nil) != tc.ok || ns != tc.ns || name != tc.name {
			t.Errorf("parseConfigMap(%q) = %q, %q, %v; want %q, %q, ok=%v", tc.ref, ns, name, err, tc.ns, tc.name, tc.ok)
		}
	}
}
