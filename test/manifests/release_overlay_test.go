// SPDX-License-Identifier: Apache-2.0

package manifests

import (
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/hack/images/overlay"
)

// TestReleaseOverlayPinsDigests: the overlay `make images` writes (hack/images/overlay) renders every
// container of dkc-server and dkc-sidecar, init containers included, as <repo>/<image>@<index digest>,
// with no tag left. It is written outside deploy/, as under _output/release/deploy, over deploy/base (the
// self-signed overlay the Makefile uses by default needs certificates generated first).
func TestReleaseOverlayPinsDigests(t *testing.T) {
	const repo = "registry.example.com/dkc"
	digests := map[string]string{
		"dkc-server":  "sha256:" + strings.Repeat("a1", 32),
		"dkc-sidecar": "sha256:" + strings.Repeat("b2", 32),
	}
	dir := filepath.Join(t.TempDir(), "release", "deploy")
	var pins []overlay.Image
	for name, d := range digests {
		pins = append(pins, overlay.Image{Name: name, Repo: repo, Digest: d})
	}
	if err := overlay.Write(dir, filepath.Join(repoRoot(t), "deploy/base"), pins); err != nil {
		t.Fatal(err)
	}
	objs := render(t, dir)

	var d appsv1.Deployment
	find(t, objs, "Deployment", "dkc-server", &d)
	var ds appsv1.DaemonSet
	find(t, objs, "DaemonSet", "dkc-sidecar", &ds)
	checked := 0
	for image, spec := range map[string][]string{
		"dkc-server":  containerImages(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers),
		"dkc-sidecar": containerImages(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers),
	} {
		for _, got := range spec {
			if want := repo + "/" + image + "@" + digests[image]; got != want {
				t.Errorf("%s: container image %s, want %s", image, got, want)
			}
			checked++
		}
	}
	if checked < 3 { // dkc-server; the sidecar and its init container
		t.Errorf("checked %d containers, want every container of both workloads", checked)
	}
}

func containerImages(lists ...[]corev1.Container) []string {
	var out []string
	for _, l := range lists {
		for _, c := range l {
			out = append(out, c.Image)
		}
	}
	return out
}
