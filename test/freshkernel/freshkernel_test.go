// SPDX-License-Identifier: Apache-2.0

//go:build integration

// Package freshkernel is the brand-new-machine regression test of the dev cluster. It changes host-wide
// kernel settings, so `make test-integration` runs it alone, before the suites that run side by side.
package freshkernel

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/component-helpers/node/util/sysctl"

	"github.com/dkc-dev/dkc/internal/ciskip"
	"github.com/dkc-dev/dkc/test/devcluster"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// freshKernel is what a brand-new machine's kernel has for the settings the kubelet requires: measured
// (kernel.panic=1, kernel.panic_on_oops=0, vm.overcommit_memory=0) and the kernel's defaults for the rest.
var freshKernel = map[string]int{"vm/overcommit_memory": 0, "vm/panic_on_oom": 0, "kernel/panic": 1, "kernel/panic_on_oops": 0,
	"kernel/keys/root_maxkeys": 200, "kernel/keys/root_maxbytes": 20000}

// TestRealNodeOnFreshKernel is the brand-new-machine regression test: with the kernel settings the kubelet
// requires back at a fresh kernel's values, a cluster with a real node (kubelet under systemd-nspawn, where
// /proc/sys is read-only so the kubelet cannot set them itself) still comes up, because the dev cluster
// provisions the host as node provisioning would. It restores every setting it changed, after the cluster
// it started has stopped.
func TestRealNodeOnFreshKernel(t *testing.T) {
	// The settings are the host's: lowering them breaks the next kubelet restart of any other dev cluster on
	// this machine (a developer's make up, another test binary), so none may run: `make test-integration`
	// runs this package alone, before the suites. A runtime dir left by a killed run has nothing alive in
	// it and does not count.
	live, err := devcluster.LiveRuntimeDirs()
	if err != nil {
		t.Fatal(err)
	}
	if len(live) > 0 {
		ciskip.Skipf(t, "another dev cluster runs on this host (%s): resetting the host's kernel settings would break its kubelet", strings.Join(live, ", "))
	}
	sys := sysctl.New()
	saved := map[string]int{}
	for name := range freshKernel {
		v, err := sys.GetSysctl(name)
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		saved[name] = v
	}
	// Registered first, so it runs last: after the cluster below has stopped.
	t.Cleanup(func() {
		for name, v := range saved {
			if err := sys.SetSysctl(name, v); err != nil {
				t.Errorf("restore %s=%d: %v", name, v, err)
			}
		}
	})
	// Applied after the build, right before Start: the host runs with a fresh kernel's values for as short a
	// time as possible (Start provisions them before its node starts).
	resetKernel := func() {
		for name, v := range freshKernel {
			if err := sys.SetSysctl(name, v); err != nil {
				t.Fatalf("reset %s to a fresh kernel's %d: %v", name, v, err)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // includes a cold binary build
	defer cancel()
	dir, err := devclustertest.Dir("fresh-kernel")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	bins, err := devclustertest.Build(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var progress strings.Builder
	cfg := devcluster.Config{Dir: dir, RealNodes: []string{"fresh-1"}, ServiceBinary: bins["dkc-server"],
		SidecarBinary: bins["dkc-sidecar"], FakeKubeletBinary: bins["fake-kubelet"], Progress: &progress}
	resetKernel()
	c, err := devcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start a cluster with a real node on a fresh kernel: %v\n%s\nkubelet log: %s", err, progress.String(),
			filepath.Join(dir, "logs", "fresh-1", "kubelet.log"))
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	if !strings.Contains(progress.String(), "node provisioning: set vm.overcommit_memory=1 (was 0), kernel.panic=10 (was 1), kernel.panic_on_oops=1 (was 0)") {
		t.Errorf("make up's output does not say which kernel settings it made:\n%s", progress.String())
	}
	for _, tun := range devcluster.KubeletKernelTunables() {
		if v, err := sys.GetSysctl(tun.Name); err != nil || v != tun.Value {
			t.Errorf("%s: %d (%v) after start, want %d", tun.Name, v, err, tun.Value)
		}
	}
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet is up (Start waited for /healthz and registration); it also serves configz through the
	// apiserver, and systemd has not restarted it: its ContainerManager started the first time.
	if _, err := client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/fresh-1/proxy/configz").DoRaw(ctx); err != nil {
		t.Fatalf("configz of the node on a fresh kernel: %v", err)
	}
	if log, err := os.ReadFile(filepath.Join(dir, "logs", "fresh-1", "kubelet.log")); err != nil {
		t.Fatal(err)
	} else if strings.Contains(string(log), "Failed to start ContainerManager") {
		t.Errorf("the kubelet failed to start its container manager at least once:\n%s", log)
	}
}
