// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// TestSidecarRestartedDuringAnAPIServerOutage: the apiserver is down (frozen) for longer than the kubelet's
// webhook authentication cache, and node-1's sidecar container is killed meanwhile; the kubelet restarts it
// from its own pod state. The new sidecar cannot be told its kubelet's version (dkc-server cannot review its
// token), so it checks nothing and leaves the kubelet alone (a version remembered from before its restart
// may be stale); it must neither blame the node's config nor restart the kubelet; once the apiserver is
// back the config is proven active again. No kubelet start from the outage on.
func TestSidecarRestartedDuringAnAPIServerOutage(t *testing.T) {
	const node = "node-1"
	resetAfter(t)
	cm := createConfig(t, "installed-outage", node, 83)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)
	// The kubelet restarted into the config must have synced its pods before the outage (a kubelet that
	// starts without the apiserver knows no pod to restart a container of): wait until no kubelet has
	// started on either node for 10s, whatever earlier tests left in motion.
	quietSince, last := time.Now(), kubeletStarts(t, node)+kubeletStarts(t, "node-2")
	poll.For(t, 2*time.Minute, time.Second, "the kubelets to stay up for 10s", func() bool {
		if n := kubeletStarts(t, node) + kubeletStarts(t, "node-2"); n != last {
			quietSince, last = time.Now(), n
		}
		return time.Since(quietSince) >= 10*time.Second
	})
	waitRunning(t, node, cm, time.Minute)
	before := kubeletStarts(t, node)
	otherBefore := kubeletStarts(t, "node-2")
	envFile := filepath.Join(cluster.DynamicConfigDir(node), "kubelet.env")
	env, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	containerd := cluster.ContainerdAddress(node)
	sidecar := func() string { // the running dkc-sidecar container's id
		t.Helper()
		out, err := exec.Command("ctr", "--address", containerd, "-n", "k8s.io", "containers", "ls", "--quiet",
			`labels."io.kubernetes.container.name"==dkc-sidecar`).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr containers ls: %v: %s", err, out)
		}
		for _, id := range strings.Fields(string(out)) {
			if st, err := exec.Command("ctr", "--address", containerd, "-n", "k8s.io", "tasks", "ps", id).CombinedOutput(); err == nil && len(st) > 0 {
				return id
			}
		}
		return ""
	}
	old := sidecar()
	if old == "" {
		t.Fatalf("no running dkc-sidecar container on %s", node)
	}

	// How often the sidecars on node so far started without their kubelet's version, from their logs.
	unverified := func() int { return sidecarLogLines(t, node, "", "kubelet version not known yet") }
	seenBefore := unverified()

	if err := cluster.Signal("kube-apiserver", syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := cluster.Signal("kube-apiserver", syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)
	time.Sleep(40 * time.Second) // past the kubelet's 30s authentication cache (installed form's config)
	if out, err := exec.Command("ctr", "--address", containerd, "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", old).CombinedOutput(); err != nil {
		t.Fatalf("kill the sidecar container %s: %v: %s", old, err, out)
	}
	// The kubelet starts a new container for the pod without the apiserver; wait for it, then for its verdict.
	deadline := time.Now().Add(2 * time.Minute) // for both
	poll.For(t, time.Until(deadline), 500*time.Millisecond, "the kubelet to start a new dkc-sidecar container during the outage", func() bool {
		id := sidecar()
		return id != "" && id != old
	})
	poll.For(t, time.Until(deadline), 500*time.Millisecond, fmt.Sprintf("the new sidecar to say it waits for its kubelet's version (logs: %s/pods)",
		cluster.NodeLogDir(node)), func() bool { return unverified() != seenBefore })
	time.Sleep(devclustertest.HealthTimeout + 5*time.Second) // past the sidecar's health timeout
	if d := kubeletStarts(t, node) - before; d != 0 {
		t.Errorf("%s: kubelet started %d times during the outage, want 0", node, d)
	}
	if after, _ := os.ReadFile(envFile); string(after) != string(env) {
		t.Errorf("kubelet.env changed during the outage (a rollback):\n%s\n→\n%s", env, after)
	}

	resume()
	waitRunning(t, node, cm, 3*time.Minute)
	if d := kubeletStarts(t, node) - before; d != 0 {
		t.Errorf("%s: kubelet started %d times after the outage, want 0", node, d)
	}
	if got := configzQPS(t, node); got != 83 {
		t.Errorf("%s: configz eventRecordQPS = %v, want 83", node, got)
	}
	if d := kubeletStarts(t, "node-2") - otherBefore; d != 0 {
		t.Errorf("node-2: kubelet started %d times during node-1's outage test, want 0", d)
	}
	if v := view(t, "node-2"); srcName(v.status.Active) != "local" || v.status.Error != "" || v.configOK == nil || v.configOK.Status != "True" {
		t.Errorf("node-2 after the outage: %s; want its local config, ConfigOK True", v)
	}
}
