// SPDX-License-Identifier: Apache-2.0

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
