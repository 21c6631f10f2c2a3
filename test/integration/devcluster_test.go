//go:build integration

package integration

import (
	"context"
	"io"
	"net"
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

// stopLeavesNothingBehind stops the kubeadm-style node's cluster (a second complete cluster next to the
// shared one, as `make up` runs while tests run: a real node under systemd-nspawn with its sidecar, the
// service and a simulated node) from a fresh handle opened from its directory — what `make down` does — and
// checks that no recorded process, mount, network namespace, interface, cgroup or runtime directory survives.
func stopLeavesNothingBehind(ctx context.Context, t *testing.T, dir string, c *devcluster.Cluster, node string) {
	state := c.State()
	if state.Network.Bridge == cluster.State().Network.Bridge || state.Network.GatewayIP == cluster.State().Network.GatewayIP {
		t.Fatalf("two clusters share a network: %+v and %+v", state.Network, cluster.State().Network)
	}
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctx); err != nil {
		t.Fatalf("configz of the second cluster's node: %v", err)
	}
	pids := recordedPIDs(t, filepath.Join(dir, "run"))
	for _, want := range []string{"etcd", "kube-apiserver", "containerd-" + node, "node-" + node, "dkc-server", "kubelet-sim-1", "dkc-sidecar-sim-1"} {
		if pids[want] == "" {
			t.Errorf("no recorded process %s in %v", want, pids)
		}
	}

	reopened, err := devcluster.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := reopened.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}

	for name, pid := range pids {
		if data, err := os.ReadFile(filepath.Join("/proc", pid, "stat")); err == nil && !strings.Contains(string(data), ") Z ") {
			t.Errorf("%s (pid %s) still running", name, pid)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), state.RuntimeDir) {
		t.Errorf("mounts left under %s", state.RuntimeDir)
	}
	if _, err := os.Stat(state.RuntimeDir); !os.IsNotExist(err) {
		t.Errorf("runtime dir %s left behind (%v)", state.RuntimeDir, err)
	}
	for _, n := range state.Nodes {
		if _, err := os.Stat("/run/netns/" + n.Netns); !os.IsNotExist(err) {
			t.Errorf("network namespace %s left behind", n.Netns)
		}
		if _, err := net.InterfaceByName(n.HostVeth); err == nil {
			t.Errorf("veth %s left behind", n.HostVeth)
		}
		for _, h := range []string{"/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"} {
			if _, err := os.Stat(filepath.Join(h, "dkc-"+n.Netns)); !os.IsNotExist(err) {
				t.Errorf("cgroup %s/dkc-%s left behind", h, n.Netns)
			}
		}
	}
	if _, err := net.InterfaceByName(state.Network.Bridge); err == nil {
		t.Errorf("bridge %s left behind", state.Network.Bridge)
	}
	if _, err := os.Stat(filepath.Join(dir, "state.json")); !os.IsNotExist(err) {
		t.Errorf("state.json left behind: a later start would refuse to run")
	}
}

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
	// this machine (a developer's make up, another test binary). Only this package's own cluster may run.
	// A runtime dir left by a killed run has nothing alive in it and does not count.
	live, err := devcluster.LiveRuntimeDirs()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range live {
		if d != cluster.State().RuntimeDir {
			ciskip.Skipf(t, "another dev cluster runs on this host (%s): resetting the host's kernel settings would break its kubelet", d)
		}
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
	resetKernel := func(*devcluster.Config) {
		for name, v := range freshKernel {
			if err := sys.SetSysctl(name, v); err != nil {
				t.Fatalf("reset %s to a fresh kernel's %d: %v", name, v, err)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := clusterDir(t, "integration-fresh-kernel")
	var progress strings.Builder
	c, err := startSecondCluster(ctx, t, dir, "fresh-1", 0, &progress, resetKernel)
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

// clusterDir is a fresh, empty directory for a test's own cluster called name.
func clusterDir(t *testing.T, name string) string {
	t.Helper()
	dir, err := devclustertest.Dir(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startSecondCluster starts a complete cluster in dir next to the shared one, as `make up` does while tests
// run: one real node under systemd-nspawn with its sidecar, the service, and simNodes simulated nodes. It
// runs the shared cluster's binaries, built from this checkout when the package started (a build of its
// own, the kubelet checkers' included, cost most of a minute).
func startSecondCluster(ctx context.Context, t *testing.T, dir, node string, simNodes int, progress io.Writer, opts ...func(*devcluster.Config)) (*devcluster.Cluster, error) {
	t.Helper()
	bin := cluster.State().KubeletCheckDir // the shared cluster's sidecar's directory: every binary is there
	cfg := devcluster.Config{Dir: dir, RealNodes: []string{node}, ServiceBinary: filepath.Join(bin, "dkc-server"),
		SidecarBinary: filepath.Join(bin, "dkc-sidecar"), FakeKubeletBinary: filepath.Join(bin, "fake-kubelet"), SimNodes: simNodes, Progress: progress}
	for _, o := range opts {
		o(&cfg)
	}
	return devcluster.Start(ctx, cfg)
}

func recordedPIDs(t *testing.T, runDir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(runDir)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(runDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		pids[strings.TrimSuffix(e.Name(), ".pid")] = strings.Fields(string(data))[0]
	}
	return pids
}
