// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// repoRoot is the checkout this package sits in (hack/helmchart/chart).
const repoRoot = "../../.."

var (
	deployDir = filepath.Join(repoRoot, "deploy")
	chartDir  = filepath.Join(repoRoot, "deploy/helm/dkc")
)

// TestChartUpToDate regenerates the chart from deploy/ and compares it with the committed one, file by file:
// the chart is never edited by hand, so any difference means deploy/ or the generator changed without
// `make chart`. The committed Chart.yaml's versions are kept (a release may set them with make chart).
func TestChartUpToDate(t *testing.T) {
	var meta struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatalf("no committed chart: run make chart (%v)", err)
	}
	if err := sigsyaml.Unmarshal(b, &meta); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	want, err := Files(Config{DeployDir: deployDir, OutDir: t.TempDir(), Version: meta.Version, AppVersion: meta.AppVersion})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	err = filepath.WalkDir(chartDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(chartDir, p)
		if err != nil {
			return err
		}
		got[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for name, w := range want {
		if g, ok := got[name]; !ok || string(g) != string(w) {
			stale = append(stale, name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			stale = append(stale, name+" (not generated)")
		}
	}
	slices.Sort(stale)
	if len(stale) > 0 {
		t.Fatalf("deploy/helm/dkc is stale: run make chart and commit. Differs: %s", strings.Join(stale, ", "))
	}
}

// TestGenerateRefusesWhatItCannotExpress: when deploy/ changes where the generator puts a value, it fails
// and says so rather than writing a chart that silently lost the value.
func TestGenerateRefusesWhatItCannotExpress(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"config namespaces flag twice", "base/server.yaml", "--config-namespaces=kube-system #", "--config-namespaces=kube-system\n            - --config-namespaces=other #", "--config-namespaces= twice"},
		{"unknown image", "base/sidecar.yaml", "image: dkc-sidecar\n          args:\n            - --install-only", "image: busybox\n          args:\n            - --install-only", "neither dkc-server's nor dkc-sidecar's"},
		{"overlays differ", "overlays/cert-manager/kustomization.yaml", "  - certificates.yaml\n", "  - certificates.yaml\ncommonAnnotations: {x: \"z\"}\n", "teach hack/helmchart"},
		{"component adds an object", "components/config-namespace/namespace.yaml", "", "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: extra, namespace: dkc-configs}\n", "deploy/components/config-namespace adds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDeploy(t)
			p := filepath.Join(dir, tc.file)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			s := string(b) + tc.new // old "": appended
			if tc.old != "" {
				if !strings.Contains(string(b), tc.old) {
					t.Fatalf("%s no longer holds %q: update the test", tc.file, tc.old)
				}
				s = strings.Replace(string(b), tc.old, tc.new, 1)
			}
			if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err = Files(Config{DeployDir: dir, OutDir: t.TempDir(), Version: DefaultVersion})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Files: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func copyDeploy(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "deploy")
	err := filepath.WalkDir(deployDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(deployDir, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestParseImage(t *testing.T) {
	for _, tc := range []struct{ ref, repo, tag, digest string }{
		{"ghcr.io/dkc-dev/dkc-server:v0.1.0", "ghcr.io/dkc-dev/dkc-server", "v0.1.0", ""},
		{"localhost:5000/dkc-server:dev", "localhost:5000/dkc-server", "dev", ""},
		{"localhost:5000/dkc-server", "localhost:5000/dkc-server", "", ""},
		{"ghcr.io/dkc-dev/dkc-server@sha256:abc", "ghcr.io/dkc-dev/dkc-server", "", "sha256:abc"},
	} {
		im := parseImage(tc.ref)
		if im.repository != tc.repo || im.tag != tc.tag || im.digest != tc.digest {
			t.Errorf("parseImage(%q) = %+v, want %s %s %s", tc.ref, im, tc.repo, tc.tag, tc.digest)
		}
	}
}

// TestTemplaterEscapes: `{{` in a manifest stays text in the chart; tokens never leak.
func TestTemplaterEscapes(t *testing.T) {
	tpl := newTemplater()
	o := object{"kind": "ConfigMap", "metadata": map[string]any{"name": "x"}, "data": map[string]any{
		"a": "{{ not a template }}", "b": tpl.scalar("{{ .Values.b }}"), "c": tpl.block(".Values.c", "yaml"),
	}}
	y, err := tpl.yaml(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`a: '{{ "{{" }} not a template }}'`, "b: {{ .Values.b }}", "  {{- with .Values.c }}\n  c:\n    {{- toYaml . | nindent 4 }}\n  {{- end }}"} {
		if !strings.Contains(y, want) {
			t.Errorf("missing %q in\n%s", want, y)
		}
	}
	o["data"].(map[string]any)["d"] = "helmchart-token-99-x"
	if _, err := tpl.yaml(o); err == nil {
		t.Error("an unknown token went through")
	}
}
