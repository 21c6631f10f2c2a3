// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// TestAdmissionPolicyFile checks the file users install from deploy/ and the dev cluster installs: it decodes,
// and its binding exempts nothing — no label or namespace may lift the identity rules (issue 14 item 5).
func TestAdmissionPolicyFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", AdmissionPolicyFile))
	if err != nil {
		t.Fatal(err)
	}
	policy, binding, err := decodeAdmissionPolicy(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := policy.Spec.FailurePolicy; got == nil || *got != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", got)
	}
	if mc := policy.Spec.MatchConstraints; mc == nil || mc.ObjectSelector != nil || mc.NamespaceSelector != nil || len(mc.ExcludeResourceRules) > 0 {
		t.Errorf("policy match constraints exempt something or are missing: %+v", mc)
	}
	if binding.Spec.MatchResources != nil {
		t.Errorf("binding narrows the policy: %+v", binding.Spec.MatchResources)
	}
	if got := binding.Spec.ValidationActions; len(got) != 1 || got[0] != admissionregistrationv1.Deny {
		t.Errorf("validationActions %v, want [Deny]", got)
	}
	var resources []string
	for _, r := range policy.Spec.MatchConstraints.ResourceRules {
		resources = append(resources, r.Resources...)
	}
	if got := strings.Join(resources, ","); got != "nodes,nodes/status" {
		t.Errorf("policy covers %s, want nodes,nodes/status", got)
	}
}

func TestDecodeAdmissionPolicy(t *testing.T) {
	const (
		policy  = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: p}\n"
		binding = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: p}\n"
	)
	for _, tc := range []struct{ name, in, wantErr string }{
		{"both, comments first", "# why\n" + policy + "---\n" + binding, ""},
		{"only comments in a document", "# a\n---\n" + policy + "---\n# b\n---\n" + binding, ""},
		{"no binding", policy, "want a ValidatingAdmissionPolicy and a ValidatingAdmissionPolicyBinding"},
		{"binding of another policy", policy + "---\n" + strings.Replace(binding, "policyName: p", "policyName: q", 1), `binds policy "q"`},
		{"second policy", policy + "---\n" + policy + "---\n" + binding, "second"},
		{"other kind", policy + "---\nkind: ConfigMap\napiVersion: v1\n", `unexpected apiVersion "v1"`},
		{"unknown field", strings.Replace(policy, "metadata:", "spek: {}\nmetadata:", 1) + "---\n" + binding, "unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, b, err := decodeAdmissionPolicy([]byte(tc.in))
			if tc.wantErr == "" {
				if err != nil || p.Name != "p" || b.Name != "b" {
					t.Fatalf("got %v, %v, %v", p, b, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want one with %q", err, tc.wantErr)
			}
		})
	}
}
