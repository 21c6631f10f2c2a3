// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// TestComputeNodes: a pool's spec.perNode gives each node its values and the revision of its own content; equal
// values share a revision, a node whose values fail carries the error, and a pool without perNode computes
// nothing. What fails every node alike (an expression that does not compile, no ConfigMap) fails the preview.
func TestComputeNodes(t *testing.T) {
	const content = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\n"
	ref := v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "blue-config", KubeletConfigKey: "kubelet"}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name},
		Data: map[string]string{"kubelet": content}}
	own := v1alpha1.RevisionName(ref.Namespace, ref.KubeletConfigKey, cm.Data)
	node := func(name, instanceType string) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.1"}}}
		if instanceType != "" {
			n.Labels = map[string]string{"node.kubernetes.io/instance-type": instanceType}
		}
		return n
	}
	nodes := []corev1.Node{node("node-1", "m5.large"), node("node-2", "m5.large"), node("node-3", "m5.4xlarge"),
		node("node-4", "")}
	maxPods := v1alpha1.PerNodeValue{Field: "maxPods",
		Expression: `{'m5.large': 29, 'm5.4xlarge': 234}[node.metadata.labels['node.kubernetes.io/instance-type']]`}
	now := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		perNode *v1alpha1.PerNode
		noCM    bool
		want    []string // per node: "values | revision", "own" for the pool's revision, or "error: …"
		err     string
	}{
		{name: "no perNode: nothing computed", perNode: nil},
		{name: "values per node", perNode: &v1alpha1.PerNode{Values: []v1alpha1.PerNodeValue{maxPods}},
			want: []string{"maxPods=29 | A", "maxPods=29 | A", "maxPods=234 | B",
				"error: spec.perNode.values[0] (maxPods) on node node-4: no such key: node.kubernetes.io/instance-type"}},
		{name: "only an exception: the other nodes keep the pool's revision",
			perNode: &v1alpha1.PerNode{Exceptions: []v1alpha1.PerNodeException{{Name: "incident-4711", Node: "node-2",
				Patch: apiextensionsv1.JSON{Raw: []byte(`{"maxPods": 200}`)}}}},
			want: []string{" | own", "exception incident-4711 | A", " | own", " | own"}},
		{name: "an expression that does not compile fails the preview",
			perNode: &v1alpha1.PerNode{Values: []v1alpha1.PerNodeValue{{Field: "maxPods", Expression: "node."}}},
			err:     "kubeletconfigpool blue: spec.perNode.values[0] (maxPods): ERROR: <input>:1:6: Syntax error"},
		{name: "no ConfigMap fails the preview", perNode: &v1alpha1.PerNode{Values: []v1alpha1.PerNodeValue{maxPods}},
			noCM: true, err: `configmap kube-system/blue-config: configmaps "blue-config" not found`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(cm)
			if tc.noCM {
				client = fake.NewClientset()
			}
			o := &Options{client: client}
			pool := &v1alpha1.KubeletConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"},
				Spec: v1alpha1.KubeletConfigPoolSpec{ConfigMap: ref, PerNode: tc.perNode}}
			computed, err := o.computeNodes(context.Background(), pool, nodes, now)
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("error: got %v, want %q…", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if computed != nil {
					t.Fatalf("got %+v, want nothing computed", computed)
				}
				return
			}
			// Revisions are hashes: the test names them A, B… in the order they appear.
			names := map[string]string{own: "own"}
			var got []string
			for i, c := range computed {
				if c.row.Node != nodes[i].Name || c.row.KubeletVersion != "v1.36.1" {
					t.Errorf("row %d is %s %s", i, c.row.Node, c.row.KubeletVersion)
				}
				if c.row.Error != "" {
					got = append(got, "error: "+c.row.Error)
					continue
				}
				if c.row.Revision != v1alpha1.RevisionName(ref.Namespace, ref.KubeletConfigKey, c.data) {
					t.Errorf("%s: the revision is not its data's", c.row.Node)
				}
				if _, ok := names[c.row.Revision]; !ok {
					names[c.row.Revision] = string(rune('A' + len(names) - 1))
				}
				got = append(got, strings.Join(c.row.Values, ", ")+" | "+names[c.row.Revision])
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestPrintPreview: the VALUES column is there for a pool with perNode only, so that one without previews
// as it did before perNode existed.
func TestPrintPreview(t *testing.T) {
	rows := []NodePreview{
		{Node: "node-1", KubeletVersion: "v1.36.1", Values: []string{"maxPods=29", "exception incident-4711"},
			Changes: []FieldChange{{Field: "maxPods"}}, Needs: Disruptive},
		{Node: "node-2", KubeletVersion: "v1.36.1"},
		{Node: "node-3", KubeletVersion: "v1.36.1", Error: "no such key: x"},
	}
	ref := v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "blue-config", KubeletConfigKey: "kubelet"}
	for _, tc := range []struct {
		name    string
		perNode *v1alpha1.PerNode
		want    string
	}{
		{name: "without perNode", want: `dry run, nothing written: kubeletconfigpool/blue with configmap kube-system/blue-config key kubelet on 3 nodes
NODE    KUBELET  CHANGES           NEEDS       PODS  CPU  MEMORY  NOT ADMITTED  EVICTED
node-1  v1.36.1  1                 disruptive  -     -    -       -             -
node-2  v1.36.1  0                 -           -     -    -       -             -
node-3  v1.36.1  <no such key: x>                                               
`},
		{name: "with perNode", perNode: &v1alpha1.PerNode{},
			want: `dry run, nothing written: kubeletconfigpool/blue with configmap kube-system/blue-config key kubelet on 3 nodes
NODE    KUBELET  CHANGES           NEEDS       PODS  CPU  MEMORY  NOT ADMITTED  EVICTED  VALUES
node-1  v1.36.1  1                 disruptive  -     -    -       -             -        maxPods=29, exception incident-4711
node-2  v1.36.1  0                 -           -     -    -       -             -        -
node-3  v1.36.1  <no such key: x>                                                        -
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := &v1alpha1.KubeletConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"},
				Spec: v1alpha1.KubeletConfigPoolSpec{ConfigMap: ref, PerNode: tc.perNode}}
			var out bytes.Buffer
			if err := printPreview(&out, pool, rows); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", out.String(), tc.want)
			}
		})
	}
}
