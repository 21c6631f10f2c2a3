// SPDX-License-Identifier: Apache-2.0

package pernode

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

const key = "kubelet"

// base is a pool's config as people write it: comments, keys in no order, numbers a float64 would mangle.
const base = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# reserved for the OS
systemReserved:
  cpu: 500m
maxPods: 110
registryPullQPS: 1000000
imageGCHighThresholdPercent: 85
`

// sorted is base as Compute writes it back, before the fields it sets.
const sorted = `apiVersion: kubelet.config.k8s.io/v1beta1
imageGCHighThresholdPercent: 85
kind: KubeletConfiguration
maxPods: 110
registryPullQPS: 1000000
`

var now = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

func node(name, memory, kubelet string, labels map[string]string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)},
			Allocatable: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)},
			NodeInfo:    corev1.NodeSystemInfo{KubeletVersion: kubelet, Architecture: "amd64", OperatingSystem: "linux"},
		},
	}
}

func values(fieldExpr ...string) []v1alpha1.PerNodeValue {
	var vs []v1alpha1.PerNodeValue
	for i := 0; i < len(fieldExpr); i += 2 {
		vs = append(vs, v1alpha1.PerNodeValue{Field: fieldExpr[i], Expression: fieldExpr[i+1]})
	}
	return vs
}

func exc(name, node, patch string, expires *time.Time) v1alpha1.PerNodeException {
	e := v1alpha1.PerNodeException{Name: name, Node: node, Patch: apiextensionsv1.JSON{Raw: []byte(patch)}}
	if expires != nil {
		e.Expires = &metav1.Time{Time: *expires}
	}
	return e
}

func at(d time.Duration) *time.Time {
	t := now.Add(d)
	return &t
}

// memoryFormula reserves 5% of the node's memory for the system, in Mi.
const memoryFormula = `string(int(quantity(node.status.capacity.memory).asApproximateFloat() / 1048576.0 * 0.05)) + 'Mi'`

const instanceType = "node.kubernetes.io/instance-type"

func TestCompute(t *testing.T) {
	small := node("node-1", "8Gi", "v1.34.2", map[string]string{instanceType: "m5.large", "pool": "a"})
	big := node("node-2", "32Gi", "v1.35.0", map[string]string{instanceType: "m5.4xlarge"})
	bare := node("node-3", "4Gi", "v1.34.0", nil)
	for _, tc := range []struct {
		name       string
		spec       v1alpha1.PerNode
		node       *corev1.Node
		data       string
		want       string
		values     []string
		nextChange time.Time
		err        string
	}{
		{name: "memory over capacity: small node",
			spec: v1alpha1.PerNode{Values: values("systemReserved.memory", memoryFormula)}, node: small, data: base,
			want:   sorted + "systemReserved:\n  cpu: 500m\n  memory: 409Mi\n",
			values: []string{`systemReserved.memory="409Mi"`}},
		{name: "memory over capacity: big node",
			spec: v1alpha1.PerNode{Values: values("systemReserved.memory", memoryFormula)}, node: big, data: base,
			want:   sorted + "systemReserved:\n  cpu: 500m\n  memory: 1638Mi\n",
			values: []string{`systemReserved.memory="1638Mi"`}},
		{name: "maxPods by instance type, an int",
			spec: v1alpha1.PerNode{Values: values("maxPods",
				`{'m5.large': 29, 'm5.4xlarge': 234}[node.metadata.labels['`+instanceType+`']]`)}, node: small, data: base,
			want:   strings.Replace(sorted, "maxPods: 110", "maxPods: 29", 1) + "systemReserved:\n  cpu: 500m\n",
			values: []string{"maxPods=29"}},
		{name: "an integral double is written as an integer",
			spec: v1alpha1.PerNode{Values: values("podPidsLimit",
				`quantity(node.status.capacity.memory).asApproximateFloat() / 1073741824.0 * 10.0 + 30.0`)},
			node: small, data: base,
			want: "apiVersion: kubelet.config.k8s.io/v1beta1\nimageGCHighThresholdPercent: 85\n" +
				"kind: KubeletConfiguration\nmaxPods: 110\npodPidsLimit: 110\nregistryPullQPS: 1000000\n" +
				"systemReserved:\n  cpu: 500m\n",
			values: []string{"podPidsLimit=110"}},
		{name: "a missing label fails, naming the value and the node",
			spec: v1alpha1.PerNode{Values: values("maxPods", `int(node.metadata.labels['`+instanceType+`'])`)},
			node: bare, data: base,
			err: "spec.perNode.values[0] (maxPods) on node node-3: no such key: " + instanceType},
		{name: "the in operator on labels of a node without any",
			spec: v1alpha1.PerNode{Values: values("maxPods", `'pool' in node.metadata.labels ? 50 : 60`)},
			node: bare, data: base,
			want:   strings.Replace(sorted, "maxPods: 110", "maxPods: 60", 1) + "systemReserved:\n  cpu: 500m\n",
			values: []string{"maxPods=60"}},
		{name: "kubelet version",
			spec: v1alpha1.PerNode{Values: values("failSwapOn",
				`!node.status.nodeInfo.kubeletVersion.startsWith('v1.34')`)}, node: small, data: base,
			want: "apiVersion: kubelet.config.k8s.io/v1beta1\nfailSwapOn: false\nimageGCHighThresholdPercent: 85\n" +
				"kind: KubeletConfiguration\nmaxPods: 110\nregistryPullQPS: 1000000\nsystemReserved:\n  cpu: 500m\n",
			values: []string{"failSwapOn=false"}},
		{name: "a quantity is written canonically, missing parents are created",
			spec: v1alpha1.PerNode{Values: values("kubeReserved.memory", `quantity('1024Mi')`)}, node: small, data: base,
			want: "apiVersion: kubelet.config.k8s.io/v1beta1\nimageGCHighThresholdPercent: 85\n" +
				"kind: KubeletConfiguration\nkubeReserved:\n  memory: 1Gi\nmaxPods: 110\nregistryPullQPS: 1000000\n" +
				"systemReserved:\n  cpu: 500m\n",
			values: []string{`kubeReserved.memory="1Gi"`}},
		{name: "a map replaces the whole field",
			spec: v1alpha1.PerNode{Values: values("systemReserved",
				`{'memory': '1Gi', 'ephemeral-storage': '<5Gi>'}`)}, node: small, data: base,
			want:   sorted + "systemReserved:\n  ephemeral-storage: <5Gi>\n  memory: 1Gi\n",
			values: []string{`systemReserved={"ephemeral-storage":"<5Gi>","memory":"1Gi"}`}},
		{name: "a duration is written as metav1.Duration reads it",
			spec: v1alpha1.PerNode{Values: values("shutdownGracePeriod", `duration('90s')`)}, node: small, data: base,
			want:   sorted + "shutdownGracePeriod: 1m30s\nsystemReserved:\n  cpu: 500m\n",
			values: []string{`shutdownGracePeriod="1m30s"`}},
		{name: "a parent that is not an object",
			spec: v1alpha1.PerNode{Values: values("maxPods.value", `1`)}, node: small, data: base,
			err: "spec.perNode.values[0] (maxPods.value) on node node-1: maxPods is a number, not an object"},
		{name: "a result no field holds",
			spec: v1alpha1.PerNode{Values: values("maxPods", `b'abc'`)}, node: small, data: base,
			err: "spec.perNode.values[0] (maxPods) on node node-1: the result is a bytes"},
		{name: "a document that is not an object",
			spec: v1alpha1.PerNode{Values: values("maxPods", `1`)}, node: small, data: "- a\n- b\n",
			err: "node node-1: key kubelet: the document is not an object but a list"},
		{name: "a value too large to be a field fails",
			spec: v1alpha1.PerNode{Values: values("maxPods", `lists.range(5000).map(x, 'x').join()`)}, node: small,
			data: base, err: "spec.perNode.values[0] (maxPods) on node node-1: its value is 5002 bytes of JSON, more than 4096"},
		{name: "a cost over the per-call limit fails rather than running on",
			spec: v1alpha1.PerNode{Values: values("maxPods",
				`lists.range(2000).map(x, lists.range(2000).sum()).size()`)}, node: small, data: base,
			err: "spec.perNode.values[0] (maxPods) on node node-1: operation cancelled: actual cost limit exceeded"},
		{name: "an exception applies over the values, until it expires",
			spec: v1alpha1.PerNode{Values: values("systemReserved.memory", memoryFormula),
				Exceptions: []v1alpha1.PerNodeException{
					exc("incident-4711", "node-1", `{"maxPods": 200}`, at(time.Hour)),
					exc("incident-4712", "node-1", `{"systemReserved": {"memory": "2Gi"}}`, at(30*time.Minute)),
					exc("forever", "node-1", `{"imageGCHighThresholdPercent": 90}`, nil),
				}},
			node: small, data: base,
			want: "apiVersion: kubelet.config.k8s.io/v1beta1\nimageGCHighThresholdPercent: 90\nkind: KubeletConfiguration\n" +
				"maxPods: 200\nregistryPullQPS: 1000000\nsystemReserved:\n  cpu: 500m\n  memory: 2Gi\n",
			values: []string{`systemReserved.memory="409Mi"`, "exception incident-4711", "exception incident-4712",
				"exception forever"},
			nextChange: now.Add(30 * time.Minute)},
		{name: "an expired exception no longer applies: the data as it is",
			spec: v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{
				exc("incident-4711", "node-1", `{"maxPods": 200}`, at(-time.Second)),
				exc("ends-now", "node-1", `{"maxPods": 201}`, at(0)),
			}},
			node: small, data: base, want: base},
		{name: "another node's exception: the data as it is",
			spec: v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{
				exc("incident-4711", "node-2", `{"maxPods": 200}`, at(time.Hour)),
			}},
			node: small, data: base, want: base},
		{name: "null in a patch removes the field",
			spec: v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{
				exc("no-reservation", "node-1", `{"systemReserved": {"cpu": null}, "registryPullQPS": null}`, nil),
			}},
			node: small, data: base,
			want: "apiVersion: kubelet.config.k8s.io/v1beta1\nimageGCHighThresholdPercent: 85\n" +
				"kind: KubeletConfiguration\nmaxPods: 110\nsystemReserved: {}\n",
			values: []string{"exception no-reservation"}},
		{name: "a JSON document",
			spec: v1alpha1.PerNode{Values: values("maxPods", `250`)}, node: small,
			data:   `{"kind": "KubeletConfiguration", "maxPods": 110, "evictionHard": {"memory.available": "100Mi"}}`,
			want:   "evictionHard:\n  memory.available: 100Mi\nkind: KubeletConfiguration\nmaxPods: 250\n",
			values: []string{"maxPods=250"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compile(&tc.spec)
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			data := map[string]string{key: tc.data, "other": "kept: as  it is\n"}
			got, err := p.Compute(tc.node, key, data, now)
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("error: got %v, want %q…", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Compute: %v", err)
			}
			if got.Data[key] != tc.want {
				t.Errorf("document:\n%s\nwant:\n%s", got.Data[key], tc.want)
			}
			if got.Data["other"] != data["other"] || len(got.Data) != 2 {
				t.Errorf("other keys: got %q", got.Data)
			}
			if strings.Join(got.Values, "|") != strings.Join(tc.values, "|") {
				t.Errorf("values: got %q, want %q", got.Values, tc.values)
			}
			if !got.NextChange.Equal(tc.nextChange) {
				t.Errorf("next change: got %v, want %v", got.NextChange, tc.nextChange)
			}
			if data[key] != tc.data {
				t.Error("the input data was modified")
			}
		})
	}
}

func TestComputeKeepsDataWithoutValues(t *testing.T) {
	data := map[string]string{key: base}
	for _, tc := range []struct {
		name string
		spec *v1alpha1.PerNode
	}{
		{"no perNode", nil},
		{"an empty perNode", &v1alpha1.PerNode{}},
		{"only another node's exception", &v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{
			exc("x", "node-9", `{"maxPods": 1}`, nil)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compile(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Compute(node("node-1", "8Gi", "v1.34.0", nil), key, data, now)
			if err != nil {
				t.Fatal(err)
			}
			if got.Data[key] != base || got.Values != nil || !got.NextChange.IsZero() {
				t.Errorf("got %+v, want the data byte for byte and no values", got)
			}
			got.Data[key] = "changed"
			if data[key] != base {
				t.Error("Data is not a copy")
			}
		})
	}
}

func TestComputeIsDeterministic(t *testing.T) {
	p, err := Compile(&v1alpha1.PerNode{Values: values(
		"systemReserved.memory", memoryFormula,
		"evictionHard", `{'memory.available': '100Mi', 'nodefs.available': '10%', 'imagefs.available': '15%'}`,
		"featureGates", `{'B': true, 'A': false, 'C': true}`)})
	if err != nil {
		t.Fatal(err)
	}
	data := map[string]string{key: base}
	compute := func(n *corev1.Node) Result {
		t.Helper()
		r, err := p.Compute(n, key, data, now)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := compute(node("node-a", "16Gi", "v1.34.0", map[string]string{"x": "1"}))
	for range 20 {
		if b := compute(node("node-a", "16Gi", "v1.34.0", map[string]string{"x": "1"})); b.Data[key] != a.Data[key] ||
			strings.Join(b.Values, "|") != strings.Join(a.Values, "|") {
			t.Fatalf("the same inputs gave\n%s\nthen\n%s", a.Data[key], b.Data[key])
		}
	}
	// Another node whose values come out equal shares the revision; one whose values differ does not.
	same := compute(node("node-b", "16Gi", "v1.35.0", nil))
	other := compute(node("node-c", "8Gi", "v1.34.0", nil))
	rev := func(r Result) string { return v1alpha1.RevisionName("ns", key, r.Data) }
	if rev(same) != rev(a) {
		t.Errorf("equal values, different revisions:\n%s\n%s", a.Data[key], same.Data[key])
	}
	if rev(other) == rev(a) {
		t.Error("different values, the same revision")
	}
	if rev(a) == v1alpha1.RevisionName("ns", key, data) {
		t.Error("computed values, the pool's revision")
	}
}

func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *v1alpha1.PerNode
		nil  bool
		err  string
	}{
		{name: "no perNode", spec: nil, nil: true},
		{name: "nothing in it", spec: &v1alpha1.PerNode{}, nil: true},
		{name: "a value", spec: &v1alpha1.PerNode{Values: values("maxPods", `110`)}},
		{name: "a syntax error names the value",
			spec: &v1alpha1.PerNode{Values: values("maxPods", `110`, "systemReserved.memory", `quantity(`)},
			err:  "spec.perNode.values[1] (systemReserved.memory): ERROR: <input>:1:10: Syntax error"},
		{name: "an undeclared variable",
			spec: &v1alpha1.PerNode{Values: values("maxPods", `pod.spec`)},
			err:  "spec.perNode.values[0] (maxPods): ERROR: <input>:1:1: undeclared reference to 'pod'"},
		{name: "an empty field segment",
			spec: &v1alpha1.PerNode{Values: values("systemReserved..memory", `1`)},
			err:  "spec.perNode.values[0] (systemReserved..memory): field has an empty segment"},
		{name: "a patch that is a list",
			spec: &v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{
				exc("a", "node-1", `{}`, nil), exc("incident-4711", "node-1", `[{"op": "add"}]`, nil)}},
			err: `spec.perNode.exceptions[1] (incident-4711): patch is not a JSON object: [{"op": "add"}]`},
		{name: "a patch that is null",
			spec: &v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{exc("a", "node-1", `null`, nil)}},
			err:  `spec.perNode.exceptions[0] (a): patch is not a JSON object: null`},
		{name: "an empty patch",
			spec: &v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{exc("a", "node-1", ``, nil)}},
			err:  `spec.perNode.exceptions[0] (a): patch is not a JSON object: (empty)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compile(tc.spec)
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("error: got %v, want %q…", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (p == nil) != tc.nil {
				t.Errorf("program: got %v, want nil %v", p, tc.nil)
			}
		})
	}
}

func TestFromCEL(t *testing.T) {
	for _, tc := range []struct {
		expression string
		want       any
		err        string
	}{
		{expression: `110`, want: int64(110)},
		{expression: `110.0`, want: int64(110)},
		{expression: `1e6`, want: int64(1000000)},
		{expression: `0.5`, want: 0.5},
		{expression: `7u`, want: uint64(7)},
		{expression: `'a'`, want: "a"},
		{expression: `true`, want: true},
		{expression: `null`, want: nil},
		{expression: `[1, 2]`, want: []any{int64(1), int64(2)}},
		{expression: `[]`, want: []any{}},
		{expression: `{'a': {'b': [2.0]}}`, want: map[string]any{"a": map[string]any{"b": []any{int64(2)}}}},
		{expression: `quantity('1536Mi')`, want: "1536Mi"},
		{expression: `quantity('2048Mi')`, want: "2Gi"},
		{expression: `node.metadata.labels`, want: map[string]any{"pool": "a"}},
		{expression: `{1: 'a'}`, err: "the result is a map with a int key, not a string"},
		{expression: `1.0 / 0.0`, err: "the result +Inf is not a JSON number"},
		{expression: `timestamp('2026-01-01T00:00:00Z')`, err: "the result is a google.protobuf.Timestamp"},
	} {
		t.Run(tc.expression, func(t *testing.T) {
			prog, err := compile(tc.expression)
			if err != nil {
				t.Fatal(err)
			}
			v := value{prog: prog}
			got, err := v.eval(map[string]any{"node": nodeVariable(node("n", "1Gi", "v1.34.0", map[string]string{"pool": "a"}))})
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("error: got %v, want %q…", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}
