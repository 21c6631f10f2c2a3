// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNeitherTheKubeletNorTheServer: kubectl-dkc is a client. It runs the kubelet's config code through
// the dkc-kubelet-check-<minor> helpers, as the sidecar does, and shares only dkc's vocabulary
// (internal/nodeconfig) and the helpers' protocol (internal/kubeletcheck/checkapi, no kubelet code) with the
// components.
func TestLinksNeitherTheKubeletNorTheServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{"k8s.io/kubernetes/", "github.com/dkc-dev/dkc/internal/kubeletcheck",
		"github.com/dkc-dev/dkc/services/", "github.com/dkc-dev/dkc/sidecar/", "github.com/dkc-dev/dkc/proto/",
		"google.golang.org/grpc"}
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) && dep != "github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi" {
				t.Errorf("kubectl-dkc links %s", dep)
			}
		}
	}
	t.Logf("kubectl-dkc links %d packages", len(deps))
}
