// SPDX-License-Identifier: Apache-2.0

package devclustertest

import (
	"os"
	"reflect"
	"testing"
)

func TestInstalledKubeletVersions(t *testing.T) {
	for _, tc := range []struct {
		name, env   string
		set         bool
		kubeVersion string
		want        map[string]string
	}{
		{name: "default: the oldest kubelet beside the default control plane", want: map[string]string{"node-1": "1.34"}},
		{name: "control plane 1.36", kubeVersion: "1.36", want: map[string]string{"node-1": "1.34"}},
		{name: "env wins", env: "node-2=1.35", set: true, want: map[string]string{"node-2": "1.35"}},
		{name: "empty env: no skew", env: "", set: true, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.set {
				t.Setenv("KUBELET_VERSIONS", tc.env)
			} else {
				t.Setenv("KUBELET_VERSIONS", "")
				os.Unsetenv("KUBELET_VERSIONS")
			}
			got, err := InstalledKubeletVersions(tc.kubeVersion)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("InstalledKubeletVersions(%q) = %v, %v; want %v", tc.kubeVersion, got, err, tc.want)
			}
		})
	}
}
