// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestServiceLinksNoSidecarCode: the service and the sidecar share dkc's vocabulary and the protocol, not
// each other's code. Go's internal rule keeps sidecar/internal out, but not internal/outbox, the sidecar's
// report outbox kept in internal/ so that the service's protocol test can drive it: a service that
// linked it would be one refactor from two implementations of one side of the protocol. Nor does it link
// the kubelet's code (internal/kubeletcheck), which runs in the dkc-kubelet-check helpers: of that module
// it links only checkapi, the helpers' protocol, which links nothing of the kubelet.
func TestServiceLinksNoSidecarCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/dkc-dev/dkc/services/...").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{"github.com/dkc-dev/dkc/internal/outbox", "github.com/dkc-dev/dkc/sidecar/",
		"github.com/dkc-dev/dkc/internal/kubeletcheck"}
	allowed := "github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		if dep == allowed {
			continue
		}
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f)) {
				t.Errorf("the service links %s", dep)
			}
		}
	}
	t.Logf("the service links %d packages", len(deps))
}
