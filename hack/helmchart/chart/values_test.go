// SPDX-License-Identifier: Apache-2.0

package chart

import "testing"

// TestValueBlocks: a value short enough for its key's line follows the key there; a map or a list with
// entries goes beneath it, indented under its key (the placement's keys sit one level deeper than the
// network policy's and configNamespaces); unset placement reads as empty.
func TestValueBlocks(t *testing.T) {
	p := placement{
		replicas:         2,
		configNamespaces: []string{"kube-system", "team-a"},
		nodeSelector:     map[string]any{"server": map[string]any{"kubernetes.io/os": "linux"}},
		tolerations:      map[string]any{"sidecar": []any{map[string]any{"operator": "Exists"}}},
	}
	np := networkPolicy{ipv4PodCIDRs: []any{"10.244.0.0/16"}}
	vals, err := valueBlocks(p, np)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, want string }{
		{"replicas", " 2"},
		{"configNamespaces", "\n  - kube-system\n  - team-a"},
		{"server.ns", "\n    kubernetes.io/os: linux"},
		{"server.tol", " []"},
		{"sidecar.ns", " {}"},
		{"sidecar.tol", "\n    - operator: Exists"},
		{"np.ipv4", "\n  - 10.244.0.0/16"},
		{"np.ipv6", " []"},
	} {
		if got := vals[tc.key]; got != tc.want {
			t.Errorf("%s = %q, want %q", tc.key, got, tc.want)
		}
	}
	if len(vals) != 8 {
		t.Errorf("%d values, want 8: %q", len(vals), vals)
	}
}
