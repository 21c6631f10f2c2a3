// SPDX-License-Identifier: Apache-2.0

package overlay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

var digest = "sha256:" + strings.Repeat("0f", 32)

func TestWrite(t *testing.T) {
	root := t.TempDir()
	base := filepath.Join(root, "deploy", "overlays", "self-signed")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, File), []byte("resources: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "_output", "release", "deploy")
	err := Write(dir, base, []Image{{Name: "dkc-server", Repo: "reg.example/dkc", Digest: digest}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, File))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := sigsyaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatal(err)
	}
	// Relative, so the overlay moves with the checkout; no newTag, which kustomize would render beside the digest.
	if len(k.Resources) != 1 || k.Resources[0] != "../../../deploy/overlays/self-signed" {
		t.Errorf("resources %v", k.Resources)
	}
	want := image{Name: "ghcr.io/dkc-dev/dkc-server", NewName: "reg.example/dkc/dkc-server", Digest: digest}
	if len(k.Images) != 1 || k.Images[0] != want || strings.Contains(string(b), "newTag") {
		t.Errorf("images %+v, want [%+v]:\n%s", k.Images, want, b)
	}
}

func TestWriteRefuses(t *testing.T) {
	base := t.TempDir()
	if err := os.WriteFile(filepath.Join(base, File), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		base  string
		image Image
	}{
		{"base without kustomization", t.TempDir(), Image{Name: "dkc-server", Repo: "r", Digest: digest}},
		{"tag for a digest", base, Image{Name: "dkc-server", Repo: "r", Digest: "v0.2.0"}},
		{"no repo", base, Image{Name: "dkc-server", Digest: digest}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Write(t.TempDir(), tc.base, []Image{tc.image}); err == nil {
				t.Error("want an error")
			}
		})
	}
}
