// SPDX-License-Identifier: Apache-2.0

package resolve

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/payload"
)

func node(spec *corev1.NodeConfigSource, annotation *string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{ConfigSource: spec}}
	if annotation != nil {
		n.Annotations = map[string]string{nodeconfig.SourceAnnotation: *annotation}
	}
	return n
}

func ptr(s string) *string { return &s }

func TestNodeSource(t *testing.T) {
	specSrc := &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "from-spec", KubeletConfigKey: "kubelet"}}
	for _, tc := range []struct {
		name       string
		node       *corev1.Node
		wantName   string
		wantOrigin Origin
		wantErr    string // substring of the status error; "" = no error
		wantDetail string // substring of the error's log detail
	}{
		{name: "nothing is local", node: node(nil, nil), wantOrigin: OriginNone},
		{name: "annotation", node: node(nil, ptr(`{"configMap":{"namespace":"kube-system","name":"my-node-config-gkt4c2m4b2","kubeletConfigKey":"kubelet"}}`)),
			wantName: "my-node-config-gkt4c2m4b2", wantOrigin: OriginAnnotation},
		{name: "spec wins over annotation", node: node(specSrc, ptr(`{"configMap":{"namespace":"kube-system","name":"ann","kubeletConfigKey":"kubelet"}}`)),
			wantName: "from-spec", wantOrigin: OriginSpec},
		{name: "not JSON", node: node(nil, ptr(`configMap: x`)), wantOrigin: OriginAnnotation,
			wantErr: `failed to sync: invalid NodeConfigSource: metadata.annotations[dkc.dev/config-source]: Invalid value: "configMap: x": not the JSON of a NodeConfigSource`},
		{name: "empty object", node: node(nil, ptr(`{}`)), wantOrigin: OriginAnnotation,
			wantErr: "failed to sync: invalid NodeConfigSource, exactly one subfield must be non-nil, but all were nil"},
		{name: "unknown source type", node: node(nil, ptr(`{"secret":{"name":"x"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "failed to sync: invalid NodeConfigSource, exactly one subfield must be non-nil, but all were nil"},
		{name: "namespace missing", node: node(nil, ptr(`{"configMap":{"name":"a","kubeletConfigKey":"kubelet"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "metadata.annotations[dkc.dev/config-source].configMap.namespace: Required value: namespace must be set"},
		{name: "name missing", node: node(nil, ptr(`{"configMap":{"namespace":"a","kubeletConfigKey":"kubelet"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "configMap.name: Required value: name must be set"},
		{name: "key missing", node: node(nil, ptr(`{"configMap":{"namespace":"a","name":"b"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "configMap.kubeletConfigKey: Required value: kubeletConfigKey must be set"},
		{name: "uid forbidden", node: node(nil, ptr(`{"configMap":{"namespace":"a","name":"b","kubeletConfigKey":"k","uid":"x"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "configMap.uid: Forbidden: uid must not be set in spec"},
		{name: "resourceVersion forbidden", node: node(nil, ptr(`{"configMap":{"namespace":"a","name":"b","kubeletConfigKey":"k","resourceVersion":"1"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "configMap.resourceVersion: Forbidden: resourceVersion must not be set in spec"},
		{name: "namespace invalid", node: node(nil, ptr(`{"configMap":{"namespace":"Kube_System","name":"b","kubeletConfigKey":"k"}}`)), wantOrigin: OriginAnnotation,
			wantErr: `configMap.namespace: Invalid value: "Kube_System"`},
		{name: "name invalid", node: node(nil, ptr(`{"configMap":{"namespace":"a","name":"B..","kubeletConfigKey":"k"}}`)), wantOrigin: OriginAnnotation,
			wantErr: `configMap.name: Invalid value: "B.."`},
		{name: "key invalid", node: node(nil, ptr(`{"configMap":{"namespace":"a","name":"b","kubeletConfigKey":"../k"}}`)), wantOrigin: OriginAnnotation,
			wantErr: `configMap.kubeletConfigKey: Invalid value: "../k"`},
		{name: "spec validated with spec path", node: node(&corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Name: "a", KubeletConfigKey: "k"}}, nil), wantOrigin: OriginSpec,
			wantErr: "spec.configSource.configMap.namespace: Required value: namespace must be set"},
		// --config-namespaces: a well-formed source outside the allowed namespaces is refused with dkc's own
		// status text, whatever field it came from; malformed sources keep the apiserver's messages.
		{name: "annotation in a namespace not allowed", node: node(nil, ptr(`{"configMap":{"namespace":"other","name":"c","kubeletConfigKey":"kubelet"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "failed to sync: config namespace not allowed, see dkc-server log for details", wantDetail: `namespace "other"; dkc-server reads configs only from kube-system,team-a`},
		{name: "spec in a namespace not allowed", node: node(&corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "default", Name: "c", KubeletConfigKey: "k"}}, nil), wantOrigin: OriginSpec,
			wantErr: "failed to sync: config namespace not allowed, see dkc-server log for details"},
		{name: "second allowed namespace", node: node(nil, ptr(`{"configMap":{"namespace":"team-a","name":"c","kubeletConfigKey":"kubelet"}}`)),
			wantName: "c", wantOrigin: OriginAnnotation},
		{name: "malformed outside the allowed namespaces keeps the apiserver message", node: node(nil, ptr(`{"configMap":{"namespace":"other","name":"c"}}`)), wantOrigin: OriginAnnotation,
			wantErr: "configMap.kubeletConfigKey: Required value: kubeletConfigKey must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, origin, err := NodeSource(tc.node, NewNamespaces("team-a", "kube-system"))
			if origin != tc.wantOrigin {
				t.Errorf("origin = %q, want %q", origin, tc.wantOrigin)
			}
			if tc.wantErr != "" {
				var se *SourceError
				if !errors.As(err, &se) || !strings.Contains(se.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want a SourceError containing %q", err, tc.wantErr)
				}
				if !strings.Contains(se.Detail, tc.wantDetail) {
					t.Errorf("detail = %q, want it to contain %q", se.Detail, tc.wantDetail)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			var got string
			if src != nil && src.ConfigMap != nil {
				got = src.ConfigMap.Name
			}
			if got != tc.wantName {
				t.Errorf("name = %q, want %q", got, tc.wantName)
			}
		})
	}
}

func TestNodeSourceDoesNotAliasCache(t *testing.T) {
	n := node(&corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "a", Name: "b", KubeletConfigKey: "k"}}, nil)
	src, _, _ := NodeSource(n, NewNamespaces("a"))
	src.ConfigMap.UID = "mutated"
	if n.Spec.ConfigSource.ConfigMap.UID != "" {
		t.Fatal("NodeSource returned a pointer into the node object (the original kubelet's resync bug)")
	}
}

func TestAssignment(t *testing.T) {
	ref := &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c", KubeletConfigKey: "kubelet"}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "c", UID: "uid-1", ResourceVersion: "42"},
		Data:       map[string]string{"kubelet": "kind: KubeletConfiguration", "ca.crt": "x"},
		BinaryData: map[string][]byte{"bin": {0xff}},
	}
	a, err := Assignment(ref, cm)
	if err != nil {
		t.Fatal(err)
	}
	got := a.GetSource().GetConfigMap()
	if got.GetUid() != "uid-1" || got.GetResourceVersion() != "42" || got.GetKubeletConfigKey() != "kubelet" || got.GetName() != "c" {
		t.Errorf("source = %v", got)
	}
	if len(a.GetFiles()) != 2 || a.GetFiles()["ca.crt"] != "x" {
		t.Errorf("files = %v (binaryData must be ignored)", a.GetFiles())
	}
	if a.GetContentHash() != payload.Hash(got, a.GetFiles()) {
		t.Errorf("content hash does not match payload.Hash")
	}
	cm.Data["kubelet"] = "changed"
	if a.GetFiles()["kubelet"] == "changed" {
		t.Error("assignment aliases the ConfigMap's data map")
	}
	if _, err := Assignment(ref, &corev1.ConfigMap{}); err == nil {
		t.Error("a ConfigMap without UID/ResourceVersion resolved")
	}
}
