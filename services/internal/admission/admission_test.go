// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dkc-dev/dkc/services/internal/resolve"
)

func nodeWith(annotation *string) runtime.RawExtension {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	if annotation != nil {
		n.Annotations = map[string]string{"dkc.dev/config-source": *annotation}
	}
	raw, _ := json.Marshal(n)
	return runtime.RawExtension{Raw: raw}
}

func str(s string) *string { return &s }

func TestReview(t *testing.T) {
	valid := `{"configMap":{"namespace":"kube-system","name":"c","kubeletConfigKey":"kubelet"}}`
	for _, tc := range []struct {
		name      string
		old, new  *string
		user      string
		allowed   bool
		wantInMsg string
	}{
		{"no annotation", nil, nil, "admin", true, ""},
		{"valid", nil, str(valid), "admin", true, ""},
		{"unchanged malformed stays", str(`{}`), str(`{}`), "admin", true, ""},
		{"namespace missing", nil, str(`{"configMap":{"name":"c","kubeletConfigKey":"kubelet"}}`), "admin", false,
			"metadata.annotations[dkc.dev/config-source].configMap.namespace: Required value: namespace must be set"},
		{"uid forbidden", nil, str(`{"configMap":{"namespace":"a","name":"c","kubeletConfigKey":"k","uid":"x"}}`), "admin", false, "uid must not be set in spec"},
		{"all nil", nil, str(`{}`), "admin", false, "exactly one reference subfield must be non-nil"},
		{"not json", nil, str(`nope`), "admin", false, "not the JSON of a NodeConfigSource"},
		// Who may set the source is the ValidatingAdmissionPolicy's business (deploy/base/config-source-policy.yaml);
		// the webhook judges only the value, whoever writes it.
		{"node's own credential: identity is not the webhook's business", nil, str(valid), "system:node:n1", true, ""},
		{"node's own credential: still validated", nil, str(`{}`), "system:node:n1", false, "exactly one reference subfield must be non-nil"},
		{"node clears its own", str(valid), nil, "system:node:n1", true, ""},
		// --config-namespaces (here kube-system and team-a): the message names the field and the allowed list.
		{"namespace not allowed", nil, str(`{"configMap":{"namespace":"other","name":"c","kubeletConfigKey":"kubelet"}}`), "admin", false,
			`metadata.annotations[dkc.dev/config-source].configMap.namespace: Forbidden: namespace "other" is not one dkc-server reads configs from; allowed: kube-system, team-a (dkc-server --config-namespaces)`},
		{"second allowed namespace", nil, str(`{"configMap":{"namespace":"team-a","name":"c","kubeletConfigKey":"kubelet"}}`), "admin", true, ""},
		{"change into a namespace not allowed", str(valid), str(`{"configMap":{"namespace":"default","name":"c","kubeletConfigKey":"kubelet"}}`), "admin", false,
			`namespace "default" is not one dkc-server reads configs from`},
		{"unchanged outside the namespaces stays (set before the flag)", str(`{"configMap":{"namespace":"other","name":"c","kubeletConfigKey":"kubelet"}}`),
			str(`{"configMap":{"namespace":"other","name":"c","kubeletConfigKey":"kubelet"}}`), "admin", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &admissionv1.AdmissionRequest{UID: "u", Object: nodeWith(tc.new), UserInfo: authenticationv1.UserInfo{Username: tc.user}}
			if tc.old != nil || tc.name == "valid" {
				req.OldObject = nodeWith(tc.old)
			}
			resp := Review(req, resolve.NewNamespaces("team-a", "kube-system"))
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v (%v)", resp.Allowed, tc.allowed, resp.Result)
			}
			if !tc.allowed && !strings.Contains(resp.Result.Message, tc.wantInMsg) {
				t.Errorf("message %q lacks %q", resp.Result.Message, tc.wantInMsg)
			}
		})
	}
}
