// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseKubeletVersions(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{in: "", want: nil},
		{in: "  ", want: nil},
		{in: "node-1=1.34", want: map[string]string{"node-1": "1.34"}},
		{in: "node-1=1.34,node-2=1.37", want: map[string]string{"node-1": "1.34", "node-2": "1.37"}},
		{in: " node-1 = v1.35 , node-2=1.36", want: map[string]string{"node-1": "1.35", "node-2": "1.36"}},
		{in: "node-1", wantErr: `"node-1" is not node=minor`},
		{in: "=1.34", wantErr: `"=1.34" is not node=minor`},
		{in: "node-1=", wantErr: `"node-1=" is not node=minor`},
		{in: "node-1=1.34,", wantErr: `"" is not node=minor`},
		{in: "node-1=1.34.4", wantErr: `"1.34.4" is not a Kubernetes minor version`},
		{in: "node-1=latest", wantErr: `"latest" is not a Kubernetes minor version`},
		{in: "node-1=1.34,node-1=1.35", wantErr: "node node-1 is named twice"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseKubeletVersions(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseKubeletVersions(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseKubeletVersions(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			if tc.want != nil {
				if again, err := ParseKubeletVersions(FormatKubeletVersions(got)); err != nil || !reflect.DeepEqual(again, got) {
					t.Errorf("round trip through %q = %v, %v", FormatKubeletVersions(got), again, err)
				}
			}
		})
	}
}

func TestCheckKubeletVersions(t *testing.T) {
	nodes := []string{"node-1", "node-2"}
	for _, tc := range []struct {
		name         string
		controlPlane string
		versions     map[string]string
		wantErr      []string // each must be in the error; none = valid
	}{
		{name: "none", controlPlane: "1.37"},
		{name: "same as control plane", controlPlane: "1.37", versions: map[string]string{"node-1": "1.37"}},
		{name: "three minors older", controlPlane: "1.37", versions: map[string]string{"node-1": "1.34", "node-2": "1.36"}},
		{name: "one older", controlPlane: "1.35", versions: map[string]string{"node-2": "1.34"}},
		{name: "not a real node", controlPlane: "1.37", versions: map[string]string{"sim-1": "1.36"},
			wantErr: []string{"node sim-1: not a real node of the cluster (real nodes: node-1, node-2)"}},
		{name: "no module", controlPlane: "1.37", versions: map[string]string{"node-1": "1.33"},
			wantErr: []string{"no wrapper module hack/kube/v1.33", "kubelets for control plane 1.37: 1.34, 1.35, 1.36, 1.37"}},
		{name: "newer than control plane", controlPlane: "1.35", versions: map[string]string{"node-1": "1.36"},
			wantErr: []string{"kubelet 1.36 on node node-1 is newer than the control plane 1.35", "kubelets for control plane 1.35: 1.34, 1.35"}},
		{name: "four minors older", controlPlane: "1.38", versions: map[string]string{"node-1": "1.34"},
			wantErr: []string{"kubelet 1.34 on node node-1 is 4 minors older than the control plane 1.38"}},
		{name: "every error at once", controlPlane: "1.35", versions: map[string]string{"node-1": "1.37", "node-3": "1.35"},
			wantErr: []string{"node node-1 is newer", "node node-3: not a real node"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkKubeletVersions(tc.controlPlane, nodes, tc.versions)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("checkKubeletVersions = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("checkKubeletVersions = nil, want an error containing %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestControlPlaneVersions(t *testing.T) {
	if got, want := KubeVersions(), []string{"1.34", "1.35", "1.36", "1.37"}; !reflect.DeepEqual(got, want) {
		t.Errorf("KubeVersions() = %v, want %v", got, want)
	}
	if got, want := ControlPlaneVersions(), []string{"1.35", "1.36", "1.37"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ControlPlaneVersions() = %v, want %v", got, want)
	}
	if err := checkControlPlaneVersion(DefaultKubeVersion); err != nil {
		t.Errorf("the default %s: %v", DefaultKubeVersion, err)
	}
	for v, want := range map[string]string{
		"1.34": "1.34 is end of life",
		"1.33": `"1.33" is not supported by the dev cluster (control planes: 1.35, 1.36, 1.37)`,
		"1.38": `"1.38" is not supported`,
	} {
		if err := checkControlPlaneVersion(v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("checkControlPlaneVersion(%s) = %v, want an error containing %q", v, err, want)
		}
	}
}

// TestKubeModulesPinTheirMinor checks that each row of kubeModule builds the release it is named after.
func TestKubeModulesPinTheirMinor(t *testing.T) {
	root := repoRoot(t)
	for minor, mod := range kubeModule {
		v, err := requiredVersion(filepath.Join(root, mod.dir, "go.mod"), "k8s.io/kubernetes")
		if err != nil {
			t.Fatalf("%s: %v", minor, err)
		}
		if !strings.HasPrefix(v, "v"+minor+".") {
			t.Errorf("kubeModule[%s] (%s) pins k8s.io/kubernetes %s", minor, mod.dir, v)
		}
	}
}

func TestSortMinors(t *testing.T) {
	vs := []string{"1.10", "1.9", "1.37", "1.34"}
	sortMinors(vs)
	if want := []string{"1.9", "1.10", "1.34", "1.37"}; !reflect.DeepEqual(vs, want) {
		t.Errorf("sortMinors = %v, want %v", vs, want)
	}
}

func TestKubeletChecks(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"dkc-sidecar", "dkc-kubelet-check", "dkc-kubelet-check-1.34", "dkc-kubelet-check-1.37", "dkc-kubelet-check-1.37.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "dkc-kubelet-check-1.35"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := kubeletChecks(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"1.34": filepath.Join(dir, "dkc-kubelet-check-1.34"), "1.37": filepath.Join(dir, "dkc-kubelet-check-1.37")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kubeletChecks = %v, want %v", got, want)
	}
}

// TestKubeletChecksMatchKubeModules keeps the three places that pin a Kubernetes release in step: the wrapper
// modules the dev cluster builds (kubeModule), the modules each dkc-kubelet-check-<minor> is built from
// (internal/kubeletcheck/go.mod for the newest minor, kube-<minor>.mod for the older ones), and the main
// module. A node whose kubelet the dev cluster can run must be validated by the helper of the very same
// release, and dkc itself links the newest.
func TestKubeletChecksMatchKubeModules(t *testing.T) {
	root := repoRoot(t)
	checkDir := filepath.Join(root, "internal", "kubeletcheck")
	modfiles, err := filepath.Glob(filepath.Join(checkDir, "kube-*.mod"))
	if err != nil {
		t.Fatal(err)
	}
	modfiles = append(modfiles, filepath.Join(checkDir, "go.mod"))
	checks := map[string]string{} // minor -> k8s.io/kubernetes version of its helper
	for _, f := range modfiles {
		v, err := requiredVersion(f, "k8s.io/kubernetes")
		if err != nil || v == "" {
			t.Fatalf("%s: no k8s.io/kubernetes version (%v)", f, err)
		}
		minor := strings.Join(strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)[:2], ".")
		if prev, ok := checks[minor]; ok {
			t.Errorf("two helper modules pin minor %s (%s and %s)", minor, prev, v)
		}
		checks[minor] = v
	}
	for minor, mod := range kubeModule {
		want, err := requiredVersion(filepath.Join(root, mod.dir, "go.mod"), "k8s.io/kubernetes")
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := checks[minor]; !ok {
			t.Errorf("the dev cluster runs kubelet %s but no dkc-kubelet-check module pins it (add internal/kubeletcheck/kube-%s.mod with pin.sh)", minor, minor)
		} else if got != want {
			t.Errorf("minor %s: dkc-kubelet-check pins k8s.io/kubernetes %s, the dev cluster's kubelet %s (%s)", minor, got, want, mod.dir)
		}
	}
	for minor := range checks {
		if _, ok := kubeModule[minor]; !ok {
			t.Errorf("dkc-kubelet-check-%s has no dev cluster module to test it against (hack/kube/add-release.sh %s)", minor, minor)
		}
	}
	vs := KubeVersions()
	newest := vs[len(vs)-1]
	if newest != DefaultKubeVersion {
		t.Errorf("DefaultKubeVersion is %s, the newest module %s", DefaultKubeVersion, newest)
	}
	for _, f := range []string{filepath.Join(root, "go.mod"), filepath.Join(checkDir, "go.mod")} {
		if v, _ := requiredVersion(f, "k8s.io/kubernetes"); v != checks[newest] {
			t.Errorf("%s pins k8s.io/kubernetes %s, the newest supported release is %s", f, v, checks[newest])
		}
	}
}

// TestDocsNameTheSupportedVersions checks the supported-versions rows of README.md and docs/versions.md
// against the modules the dev cluster builds, so that neither claims a release that is not tested.
func TestDocsNameTheSupportedVersions(t *testing.T) {
	root := repoRoot(t)
	want := []string{"| " + strings.Join(ControlPlaneVersions(), ", ") + " |", "| " + strings.Join(KubeVersions(), ", ") + " ",
		"control plane " + DefaultKubeVersion}
	for _, doc := range []string{"README.md", "docs/versions.md"} {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		var row string
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "| main ") {
				row = line
			}
		}
		if row == "" {
			t.Errorf("%s has no supported-versions row (a table row starting with %q)", doc, "| main ")
			continue
		}
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Errorf("%s: supported-versions row does not say %q:\n%s", doc, w, row)
			}
		}
	}
}

// repoRoot is the dkc checkout the test runs in.
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := RepoRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	return root
}
