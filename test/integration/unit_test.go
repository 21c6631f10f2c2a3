// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSidecarRefusesANodeWithoutItsKubeletUnit: on a node whose systemd has no such kubelet unit (a kubelet
// run by something else), the sidecar exits at start with a message saying so, instead of failing every
// restart later as if the configs were at fault.
func TestSidecarRefusesANodeWithoutItsKubeletUnit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(cluster.Dir(), "bin", "dkc-sidecar"),
		"--node-name="+realNode, "--server=127.0.0.1:1", "--insecure",
		"--dbus-address="+cluster.BusAddress(realNode), "--kubelet-unit=absent-kubelet.service",
		"--dynamic-config-dir="+t.TempDir(), "--kubelet-config="+cluster.KubeletConfigPath(realNode))
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the sidecar kept running on a node without its kubelet unit:\n%s", out)
	}
	if err == nil || !strings.Contains(string(out), `absent-kubelet.service is \"not-found\"`) ||
		!strings.Contains(string(out), "the kubelet must run under this node's systemd") {
		t.Fatalf("want a refusal naming the missing unit; got %v:\n%s", err, out)
	}
}
