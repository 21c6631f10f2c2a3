// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/poll"
)

// TestUninstallRefusesABrokenLocalConfig: node-2 runs an assigned config and its local config no longer
// validates (eventRecordQPS: -1, which no flag of the dev kubelets overrides): `kubectl dkc uninstall --yes`
// fails naming node-2 and the validation error, and node-2's kubelet is not restarted — it stays Ready on
// its dkc config, drop-in in place. With the local config restored and dkc installed again, the suite goes
// on as before (TestUninstall, next, uninstalls for good).
func TestUninstallRefusesABrokenLocalConfig(t *testing.T) {
	diagnoseOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cm := createConfig(t, "installed-uninstall-broken-local", "node-2", 63)
	assign(t, "node-2", cm)
	waitRunning(t, "node-2", cm, 2*time.Minute)

	local := cluster.KubeletConfigPath("node-2")
	orig, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(orig, &m); err != nil {
		t.Fatal(err)
	}
	m["eventRecordQPS"] = -1
	broken, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(local, broken, 0o644); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			if err := os.WriteFile(local, orig, 0o644); err != nil {
				t.Errorf("restore node-2's local config: %v", err)
			}
			restored = true
		}
	}
	defer restore()
	starts := kubeletStarts(t, "node-2")

	out, err := kubectlDKC(ctx, "uninstall", "--yes", "--timeout=4m")
	t.Logf("kubectl dkc uninstall --yes with node-2's local config broken:\n%s%v", out, err)
	if err == nil || !strings.Contains(err.Error(), "node-2") || !strings.Contains(err.Error(), "does not pass the kubelet's validation") ||
		!strings.Contains(err.Error(), "eventRecordQPS") {
		t.Errorf("uninstall: %v; want a refusal naming node-2 and the validation error", err)
	}
	if d := kubeletStarts(t, "node-2") - starts; d != 0 {
		t.Errorf("node-2: kubelet started %d times during the refused uninstall, want 0", d)
	}
	if got := configzQPS(t, "node-2"); got != 63 {
		t.Errorf("node-2: configz eventRecordQPS = %v after the refused uninstall, want its dkc config's 63", got)
	}
	if _, err := os.Stat(filepath.Join(cluster.NodeDir("node-2"), "systemd/kubelet.service.d/20-dkc.conf")); err != nil {
		t.Errorf("node-2's drop-in is gone after the refused uninstall: %v", err)
	}
	// Ready, and still Ready past the cleanup pod's next retry (every 30s), which must restart nothing.
	waitNodesReady(t)
	for end := time.Now().Add(40 * time.Second); time.Now().Before(end) && !t.Failed(); time.Sleep(time.Second) {
		if n, err := admin(t).CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{}); err != nil || !nodeReady(n) {
			t.Errorf("node-2 not Ready after the refused uninstall (%v)", err)
		}
		if d := kubeletStarts(t, "node-2") - starts; d != 0 {
			t.Errorf("node-2: kubelet started %d times after the refused uninstall, want 0", d)
		}
	}

	// Back as the suite found it: local config restored, dkc installed again (the DaemonSet's normal mode).
	restore()
	if out, err := runKubectl(ctx, "apply", "-k", cluster.InstallDir()); err != nil {
		t.Fatalf("kubectl apply -k (reinstall): %v\n%s", err, out)
	}
	waitRolledOut(t, "daemonset/dkc-sidecar")
	waitServerSettled(t)
	resetAll(t)
}

// TestUninstall is docs/install.md's "Uninstall" on the installed form, with node-1 on an assigned config
// and node-2 on its local one: `kubectl dkc uninstall --yes` restarts node-1's kubelet once, onto its local
// config, and node-2's not at all; no dkc file is left on either node, and no dkc mark on the Nodes; a
// further kubelet restart is healthy (nothing of dkc's is needed to start); a second uninstall changes
// nothing; then the user's last step (kubectl delete -k), an uninstall against the cluster without dkc, and
// a new install on which an assignment becomes active again.
//
// It takes dkc away, so it runs after every other test of the suite: Go runs the test files in the order of
// their names and this one's sorts last (keep it so: name a new file so that it sorts before
// uninstall_test.go). It leaves dkc installed again, as found.
func TestUninstall(t *testing.T) {
	diagnoseOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cm := createConfig(t, "installed-uninstall", "node-1", 61)
	assign(t, "node-1", cm)
	waitRunning(t, "node-1", cm, 2*time.Minute)
	waitRunning(t, "node-2", nil, time.Minute)
	localQPS := configzQPS(t, "node-2") // both nodes share one local config
	if localQPS == 61 {
		t.Fatal("node-2's local config has eventRecordQPS 61 already; the test cannot tell the configs apart")
	}
	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}

	// Without --yes: the plan, nothing done.
	out, err := kubectlDKC(ctx, "uninstall")
	if !errors.Is(err, plugin.ErrNotConfirmed) || !strings.Contains(out, "switch daemonset/dkc-sidecar to its cleanup mode") {
		t.Fatalf("uninstall without --yes: %v\n%s", err, out)
	}
	if v := view(t, "node-1"); srcName(v.status.Active) != name(cm) {
		t.Fatalf("the plan alone changed node-1: %s", v)
	}

	out, err = kubectlDKC(ctx, "uninstall", "--yes", "--timeout=5m")
	t.Logf("kubectl dkc uninstall --yes:\n%s", out)
	if err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	wantStarts := map[string]int{"node-1": 1, "node-2": 0}
	for _, n := range nodes {
		if d := kubeletStarts(t, n) - before[n]; d != wantStarts[n] {
			t.Errorf("%s: kubelet started %d times during the uninstall, want %d", n, d, wantStarts[n])
		}
		if got := configzQPS(t, n); got != localQPS {
			t.Errorf("%s: configz eventRecordQPS = %v after the uninstall, want the local config's %v", n, got, localQPS)
		}
	}
	checkNoDKCFiles(t)
	// Nothing writes the marks back (dkc-server is scaled to 0, the sidecars report nothing).
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		checkNoDKCMarks(t)
		if t.Failed() {
			break
		}
	}

	// A further kubelet restart comes up healthy and stays up, with dkc's files gone.
	for _, n := range nodes {
		starts := kubeletStarts(t, n)
		if err := cluster.RestartUnit(ctx, n, "kubelet.service"); err != nil {
			t.Fatalf("%s: systemctl restart kubelet: %v", n, err)
		}
		pid := waitKubeletServing(t, ctx, n)
		time.Sleep(10 * time.Second) // proves a negative: the kubelet stays up, started once
		if d := kubeletStarts(t, n) - starts; d != 1 {
			t.Errorf("%s: kubelet started %d times for one systemctl restart, want 1", n, d)
		}
		if state, result, err := cluster.KubeletUnitState(ctx, n); err != nil || state != "active" {
			t.Errorf("%s: kubelet.service is %s (%s) 10s after its restart: %v", n, state, result, err)
		}
		if again, err := cluster.KubeletMainPID(ctx, n); err != nil || again != pid {
			t.Errorf("%s: kubelet MainPID %d → %d (%v): it restarted by itself", n, pid, again, err)
		}
		if got := configzQPS(t, n); got != localQPS {
			t.Errorf("%s: configz eventRecordQPS = %v after a further restart, want %v", n, got, localQPS)
		}
	}
	waitNodesReady(t)

	// Again: nothing left to do, no kubelet restarted.
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	if out, err := kubectlDKC(ctx, "uninstall", "--yes", "--timeout=5m"); err != nil {
		t.Fatalf("second uninstall: %v\n%s", err, out)
	} else {
		t.Logf("second kubectl dkc uninstall --yes:\n%s", out)
	}
	for _, n := range nodes {
		if d := kubeletStarts(t, n) - before[n]; d != 0 {
			t.Errorf("%s: kubelet started %d times during a second uninstall, want 0", n, d)
		}
	}
	checkNoDKCFiles(t)
	checkNoDKCMarks(t)

	// The user's last step, as the first uninstall printed it, with the overlay the suite installed.
	if !strings.Contains(out, "kubectl delete -k") {
		t.Errorf("the uninstall did not print the kubectl delete -k step:\n%s", out)
	}
	if out, err := runKubectl(ctx, "delete", "-k", cluster.InstallDir(), "--wait=true", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl delete -k: %v\n%s", err, out)
	}
	if out, err := kubectlDKC(ctx, "uninstall", "--yes"); err != nil || !strings.Contains(out, "dkc is not installed") {
		t.Errorf("uninstall without dkc: %v\n%s", err, out)
	}

	// Installed again, the suite's way: no kubelet restarts for the install, and an assignment runs.
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	if out, err := runKubectl(ctx, "apply", "-k", cluster.InstallDir()); err != nil {
		t.Fatalf("kubectl apply -k (reinstall): %v\n%s", err, out)
	}
	waitRolledOut(t, "deployment/dkc-server")
	waitRolledOut(t, "daemonset/dkc-sidecar")
	waitServerSettled(t)
	t.Cleanup(func() { resetAll(t) })
	for _, n := range nodes {
		waitRunning(t, n, nil, 2*time.Minute)
		if d := kubeletStarts(t, n) - before[n]; d != 0 {
			t.Errorf("%s: kubelet started %d times when dkc was installed again, want 0", n, d)
		}
	}
	if _, err := os.Stat(filepath.Join(cluster.NodeDir("node-1"), "systemd/kubelet.service.d/20-dkc.conf")); err != nil {
		t.Errorf("reinstalled, node-1 has no drop-in: %v", err)
	}
	cm2 := createConfig(t, "installed-reinstalled", "node-1", 62)
	assign(t, "node-1", cm2)
	waitRunning(t, "node-1", cm2, 2*time.Minute)
	if got := configzQPS(t, "node-1"); got != 62 {
		t.Errorf("node-1 configz eventRecordQPS = %v after an assignment on the new install, want 62", got)
	}
	if d := kubeletStarts(t, "node-1") - before["node-1"]; d != 1 {
		t.Errorf("node-1: kubelet started %d times for one assignment on the new install, want 1", d)
	}
}

// checkNoDKCFiles: neither node holds dkc's drop-in, env file, checkpoints, meta or sidecar state (the
// cleanup pods still run, holding the node's lock file).
func checkNoDKCFiles(t *testing.T) {
	t.Helper()
	for _, n := range nodes {
		dir := cluster.DynamicConfigDir(n)
		for _, p := range []string{
			filepath.Join(cluster.NodeDir(n), "systemd/kubelet.service.d/20-dkc.conf"),
			filepath.Join(dir, "kubelet.env"),
			filepath.Join(dir, "checkpoints"),
			filepath.Join(dir, "meta"),
			filepath.Join(dir, "dkc-sidecar-state.json"),
		} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s: %s is still there", n, p)
			}
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Name() != "dkc-sidecar.lock" {
				t.Errorf("%s: %s left in the dynamic config dir", n, e.Name())
			}
		}
	}
}

// checkNoDKCMarks: no Node carries dkc's annotations, spec.configSource, status.config or ConfigOK.
func checkNoDKCMarks(t *testing.T) {
	t.Helper()
	list, err := admin(t).CoreV1().Nodes().List(ctxFor(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		for k := range n.Annotations {
			if strings.HasPrefix(k, "dkc.dev/") {
				t.Errorf("node %s still has annotation %s=%s", n.Name, k, n.Annotations[k])
			}
		}
		if n.Spec.ConfigSource != nil || n.Status.Config != nil {
			t.Errorf("node %s still has spec.configSource %v or status.config %v", n.Name, n.Spec.ConfigSource, n.Status.Config)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == "ConfigOK" {
				t.Errorf("node %s still has the ConfigOK condition (%s: %s)", n.Name, c.Status, c.Message)
			}
		}
	}
}

// waitKubeletServing waits until node's kubelet answers /configz through the apiserver, and returns its PID.
func waitKubeletServing(t *testing.T, ctx context.Context, node string) int {
	t.Helper()
	var pid int
	poll.ForNil(t, 2*time.Minute, 500*time.Millisecond, node+": the kubelet to serve after its restart", func() error {
		_, err := admin(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctx)
		var perr error
		pid, perr = cluster.KubeletMainPID(ctx, node)
		if err == nil && perr == nil && pid > 0 {
			return nil
		}
		if err := errors.Join(err, perr); err != nil {
			return err
		}
		return fmt.Errorf("kubelet main PID %d", pid)
	})
	return pid
}
