// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
)

// TestKubeadmRewritingTheLocalConfigIsNotDrift: `kubeadm upgrade node` rewrites the node's local config
// (/var/lib/kubelet/config.yaml) and the kubelet is restarted by hand, while the node runs an assigned
// config. The kubelet still runs the assigned config, and the sidecar, which checks every kubelet start it
// did not make, finds no drift: the Node's ConfigDrift condition does not turn True, ConfigOK stays True,
// and the only kubelet start is the test's.
func TestKubeadmRewritingTheLocalConfigIsNotDrift(t *testing.T) {
	const node = "node-2"
	diagnoseOnFailure(t)
	resetAfter(t)
	// The token first: until the apiserver's RBAC cache has the new binding, and then for the deny cache's
	// 30 s, a scrape with it is refused; the assignment and the trial outlast that.
	token := serviceAccountToken(t, ctxFor(t), "drift-causes-metrics", "dkc-metrics-reader")
	cm := createConfig(t, "installed-kubeadm-rewrite", node, 63)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)
	// The sidecar checks the kubelet it restarted at its next tick, and promotes the config ticks later, at
	// the trial's end (20 s): from then on no check is pending, and the next is the test's restart's.
	waitLastKnownGood(t, node, cm, time.Minute)

	path := cluster.KubeletConfigPath(node)
	original, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("node %s's local config: %v", node, err)
	}
	rewritten := nodeConfig(t, node, 64) // valid, and not what the assigned config says
	// Before resetAfter's reset, which puts the node back on this file.
	t.Cleanup(func() {
		if err := os.WriteFile(path, original, 0o644); err != nil {
			t.Errorf("restore node %s's local config %s: %v", node, path, err)
		}
	})
	// In place, as kubeadm's writeConfigBytesToDisk does (os.WriteFile), not a rename: the sidecar pod
	// bind-mounts this one file, and a mount keeps the inode it was made with.
	if err := os.WriteFile(path, []byte(rewritten), 0o644); err != nil {
		t.Fatalf("rewrite node %s's local config: %v", node, err)
	}
	driftBefore := driftCondition(t, node)
	pod := sidecarPod(t, node)
	const (
		seenText   = "kubelet started, not by the sidecar; checking it for drift"
		failedText = "drift check could not be made"
	)
	seenBefore := sidecarLogLines(t, node, pod, seenText)
	var checksBefore map[string]float64
	poll.ForNil(t, 2*time.Minute, time.Second, fmt.Sprintf("node %s's sidecar metrics", node), func() error {
		checksBefore, err = driftChecks(ctxFor(t), node, token)
		return err
	})
	starts := kubeletStarts(t, node)
	restartKubeletByHand(t, node)

	// No Node field moves when a check finds nothing (the sidecar reports only a change, and dkc-server writes
	// no condition on a node that never drifted): the sidecar's log says it saw the start, its metrics that a
	// check found no drift since.
	poll.ForNil(t, time.Minute, time.Second, fmt.Sprintf("node %s's sidecar %s to log the test's kubelet start", node, pod),
		func() error {
			if n := sidecarLogLines(t, node, pod, seenText); n <= seenBefore {
				return fmt.Errorf("%q logged %d times, as before the restart", seenText, n)
			}
			return nil
		})
	var checks map[string]float64
	poll.ForNil(t, time.Minute, time.Second, fmt.Sprintf("a drift check on %s finding none after the kubelet's restart", node),
		func() error {
			if checks, err = driftChecks(ctxFor(t), node, token); err != nil {
				return err
			}
			if checks["none"] > checksBefore["none"] {
				return nil
			}
			return fmt.Errorf("dkc_sidecar_drift_checks_total %v, before the restart %v; %q logged %d times", checks,
				checksBefore, failedText, sidecarLogLines(t, node, pod, failedText))
		})
	// A check that could not be made (the kubelet not serving /configz yet) is made again at the next tick:
	// errors are no finding; a drift is.
	if checks["drift"] != checksBefore["drift"] {
		t.Errorf("drift checks on %s since the restart: %v, before %v; want no drift found", node, checks, checksBefore)
	}
	t.Logf("drift checks on %s: %v, before the restart %v", node, checks, checksBefore)

	// The kubelet runs the assigned config, not the rewritten local one: the rewrite is nothing to report.
	if got := configzQPS(t, node); got != 63 {
		t.Errorf("configz eventRecordQPS %v after the local config was rewritten (64), want the assigned config's 63", got)
	}
	if config := kubeletFlag(t, node, "--config"); filepath.Clean(config) == filepath.Clean(nodeKubeletConfigInNode) {
		t.Errorf("node %s's kubelet runs --config=%s, its local config, not the assigned checkpoint", node, config)
	}
	drift := driftCondition(t, node)
	switch {
	case drift != nil && (drift.Status != corev1.ConditionFalse || drift.Reason != nodeconfig.DriftNone):
		t.Errorf("ConfigDrift %s %s (%s) after the local config was rewritten, want False %s or none", drift.Status,
			drift.Reason, drift.Message, nodeconfig.DriftNone)
	case drift != nil && driftBefore != nil && !drift.LastTransitionTime.Equal(&driftBefore.LastTransitionTime):
		t.Errorf("ConfigDrift changed at %v (before the restart: %s %s at %v), want it as it was", drift.LastTransitionTime,
			driftBefore.Status, driftBefore.Reason, driftBefore.LastTransitionTime)
	}
	v := waitRunning(t, node, cm, 10*time.Second)
	t.Logf("node %s after the rewrite and the restart: %s; ConfigDrift %s", node, v, describeCondition(drift))
	if d := kubeletStarts(t, node) - starts; d != 1 {
		t.Errorf("the kubelet started %d times after the local config was rewritten, want 1 (the test's restart)", d)
	}
}

// TestConfigDirDropInOverridingAFieldIsDrift: on a node whose kubelet runs with --config-dir (its directory
// mounted into the sidecar pod, as docs/dkc-sidecar.md requires), an operator adds a drop-in there that
// overrides a field the assigned config sets, and restarts the kubelet by hand. The kubelet really runs the
// drop-in's value; the sidecar reports ConfigDrift True, ConfigDirDropIn, naming the file and the field,
// and repairs nothing. The drop-in removed and the kubelet restarted again, the condition turns False
// (NoDrift) and the kubelet runs the assigned value.
func TestConfigDirDropInOverridingAFieldIsDrift(t *testing.T) {
	const node = "node-2"
	diagnoseOnFailure(t)
	resetAfter(t)
	// The installed form's kubelets have no --config-dir (KubeletConfigDir is the other form's): the node
	// gets one here. Under the kubelet's root dir, which the host sees (rootDir), at one path on every node,
	// since the DaemonSet's mount is the same on all.
	hostDir := filepath.Join(rootDir(t, node), filepath.Base(configDirInNode))
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	mountConfigDirInSidecars(t)
	addConfigDirFlag(t, node)
	// The flag is real: the kubelet's command line has it.
	if dir := kubeletFlag(t, node, "--config-dir"); dir != configDirInNode {
		t.Fatalf("node %s's kubelet runs --config-dir=%q, want %s", node, dir, configDirInNode)
	}

	cm := createConfig(t, "installed-dropin-drift", node, 62)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)
	if got := configzQPS(t, node); got != 62 {
		t.Fatalf("configz eventRecordQPS %v with an empty --config-dir, want the assigned config's 62", got)
	}

	const dropInName = "50-event-qps.conf"
	dropIn := filepath.Join(hostDir, dropInName)
	dropInInNode := filepath.Join(configDirInNode, dropInName)
	removed := false
	remove := func() {
		t.Helper()
		if removed {
			return
		}
		removed = true
		if err := os.Remove(dropIn); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		restartKubeletByHand(t, node)
	}
	t.Cleanup(remove) // before the --config-dir flag goes, then the sidecars' mount, then resetAfter's reset
	if err := os.WriteFile(dropIn, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"+
		"eventRecordQPS: 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	starts := kubeletStarts(t, node)
	restartKubeletByHand(t, node)
	restartedAt := time.Now()

	drift := waitDrift(t, node, time.Minute+30*time.Second, func(c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionTrue
	})
	reportedAt := time.Now()
	t.Logf("drift reported %v after the kubelet's restart: %s %s", reportedAt.Sub(restartedAt).Round(time.Second),
		drift.Reason, drift.Message)
	if drift.Reason != nodeconfig.DriftConfigDirDropIn {
		t.Errorf("ConfigDrift reason %s (%s), want %s", drift.Reason, drift.Message, nodeconfig.DriftConfigDirDropIn)
	}
	for _, s := range []string{dropInInNode, "eventRecordQPS"} {
		if !strings.Contains(drift.Message, s) {
			t.Errorf("ConfigDrift message %q does not name %s", drift.Message, s)
		}
	}
	// The drift is real: the kubelet merged the drop-in over the assigned config.
	if got := configzQPS(t, node); got != 7 {
		t.Errorf("configz eventRecordQPS %v with %s, want the drop-in's 7", got, dropInInNode)
	}
	if out, err := kubectlDKC(ctxFor(t), "status", node); err != nil || !strings.Contains(out, nodeconfig.DriftConfigDirDropIn) {
		t.Errorf("kubectl dkc status %s shows no drift cause %s: %v\n%s", node, nodeconfig.DriftConfigDirDropIn, err, out)
	}
	// Nothing repairs it: no kubelet start but the test's, the condition standing. A sidecar or dkc-server
	// that restored the node would act on the finding it just reported, at the latest at the sidecar's next
	// tick (10 s); no observable marks that tick, so the window is the tick and a half after the report.
	for end := reportedAt.Add(15 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if d := kubeletStarts(t, node) - starts; d != 1 {
			t.Fatalf("the kubelet started %d times after the drop-in was added, want 1 (the test's restart): "+
				"something repaired the drift", d)
		}
	}
	if c := driftCondition(t, node); c == nil || c.Status != corev1.ConditionTrue || c.Reason != drift.Reason {
		t.Errorf("ConfigDrift %s, %v after it was reported; want it standing", describeCondition(c),
			time.Since(reportedAt).Round(time.Second))
	}
	// Drift is not a config failure: the node keeps the assigned config, ConfigOK True.
	waitRunning(t, node, cm, 10*time.Second)

	remove()
	waitDrift(t, node, 2*time.Minute, func(c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == nodeconfig.DriftNone
	})
	if got := configzQPS(t, node); got != 62 {
		t.Errorf("configz eventRecordQPS %v with the drop-in removed, want the assigned config's 62", got)
	}
	waitRunning(t, node, cm, 10*time.Second)
	if d := kubeletStarts(t, node) - starts; d != 2 {
		t.Errorf("the kubelet started %d times after the drop-in was added, want 2 (the test's restarts)", d)
	}
}

const (
	// configDirInNode is the --config-dir TestConfigDirDropInOverridingAFieldIsDrift gives node-2's kubelet.
	configDirInNode = "/var/lib/kubelet/kubelet.conf.d"
	// nodeKubeletConfigInNode is the local config's path on a node of the installed form (the unit's --config).
	nodeKubeletConfigInNode = "/var/lib/kubelet/config.yaml"
	// configDirVolume names the sidecars' mount of configDirInNode.
	configDirVolume = "kubelet-config-dir"
)

// mountConfigDirInSidecars mounts configDirInNode into every sidecar pod, read-only at the same path, as
// docs/dkc-sidecar.md says a kubelet with --config-dir needs (deploy/ mounts none), and waits for the
// DaemonSet's rollout; undone when t ends.
func mountConfigDirInSidecars(t *testing.T) {
	t.Helper()
	patch := func(p string) {
		t.Helper()
		if out, err := kubectl(t, "-n", "kube-system", "patch", "daemonset/dkc-sidecar", "-p", p); err != nil {
			t.Fatalf("patch daemonset/dkc-sidecar %s: %v\n%s", p, err, out)
		}
		waitRolledOut(t, "daemonset/dkc-sidecar")
	}
	t.Cleanup(func() {
		patch(`{"spec":{"template":{"spec":{"volumes":[{"name":"` + configDirVolume + `","$patch":"delete"}],` +
			`"containers":[{"name":"dkc-sidecar","volumeMounts":[{"mountPath":"` + configDirInNode + `","$patch":"delete"}]}]}}}}`)
		// DirectoryOrCreate made it on every node; empty, unless the test failed before removing its drop-in.
		for _, n := range nodes {
			_ = os.Remove(filepath.Join(rootDir(t, n), filepath.Base(configDirInNode)))
		}
	})
	patch(`{"spec":{"template":{"spec":{"volumes":[{"name":"` + configDirVolume + `","hostPath":{"path":"` + configDirInNode +
		`","type":"DirectoryOrCreate"}}],"containers":[{"name":"dkc-sidecar","volumeMounts":[{"name":"` + configDirVolume +
		`","mountPath":"` + configDirInNode + `","readOnly":true}]}]}}}}`)
}

// addConfigDirFlag gives node's kubelet --config-dir=configDirInNode the way kubeadm's 10-kubeadm.conf sets
// the kubelet's command line, a unit drop-in replacing ExecStart (still with $KUBELET_CONFIG_ARGS, which dkc's
// env file sets), and restarts the kubelet by hand; undone, with a restart, when t ends.
func addConfigDirFlag(t *testing.T, node string) {
	t.Helper()
	unitPath := filepath.Join(cluster.NodeDir(node), "systemd", "kubelet.service")
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatalf("node %s's kubelet unit: %v", node, err)
	}
	var execStart string
	for line := range strings.Lines(string(unit)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "ExecStart="); ok {
			execStart = v
		}
	}
	if !strings.Contains(execStart, "$KUBELET_CONFIG_ARGS") {
		t.Fatalf("node %s's kubelet unit %s: ExecStart %q does not take $KUBELET_CONFIG_ARGS", node, unitPath, execStart)
	}
	dropIn := filepath.Join(cluster.KubeletDropInDir(node), "30-config-dir.conf")
	t.Cleanup(func() {
		if err := os.Remove(dropIn); err != nil {
			if !os.IsNotExist(err) {
				t.Errorf("remove %s: %v", dropIn, err)
			}
			return
		}
		if err := cluster.DaemonReload(ctxFor(t), node); err != nil {
			t.Error(err)
			return
		}
		restartKubeletByHand(t, node)
		// The sidecars' mount goes next: a sidecar must not meet a kubelet that still runs --config-dir.
		if dir := kubeletFlag(t, node, "--config-dir"); dir != "" {
			t.Errorf("node %s's kubelet still runs --config-dir=%s after %s was removed", node, dir, dropIn)
		}
	})
	content := fmt.Sprintf("[Service]\nExecStart=\nExecStart=%s --config-dir=%s\n", execStart, configDirInNode)
	if err := os.WriteFile(dropIn, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cluster.DaemonReload(ctxFor(t), node); err != nil {
		t.Fatal(err)
	}
	restartKubeletByHand(t, node)
}

// restartKubeletByHand is an operator's `systemctl restart kubelet` on node; it returns once the restarted
// kubelet serves /configz (through the apiserver's node proxy).
func restartKubeletByHand(t *testing.T, node string) {
	t.Helper()
	starts := kubeletStarts(t, node)
	if err := cluster.RestartUnit(ctxFor(t), node, "kubelet.service"); err != nil {
		t.Fatal(err)
	}
	poll.ForNil(t, 2*time.Minute, 500*time.Millisecond, fmt.Sprintf("node %s's restarted kubelet to serve /configz", node),
		func() error {
			if kubeletStarts(t, node) == starts {
				return errors.New("no new start in the kubelet's log yet")
			}
			_, err := admin(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctxFor(t))
			return err
		})
}

// kubeletFlag is the value of flag (--name) on the command line of node's running kubelet, "" without it.
func kubeletFlag(t *testing.T, node, flag string) string {
	t.Helper()
	pid := hostPID(t, node, "kubelet", "--hostname-override="+node)
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		t.Fatalf("node %s's kubelet command line: %v", node, err)
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	value := ""
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			value = v
		} else if a == flag && i+1 < len(args) {
			value = args[i+1]
		}
	}
	return value
}

// driftCondition is node's ConfigDrift condition, nil if it has none.
func driftCondition(t *testing.T, node string) *corev1.NodeCondition {
	t.Helper()
	n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == nodeconfig.DriftConditionType
	})
	if i < 0 {
		return nil
	}
	return &n.Status.Conditions[i]
}

func describeCondition(c *corev1.NodeCondition) string {
	if c == nil {
		return "none"
	}
	return fmt.Sprintf("%s %s since %v (%s)", c.Status, c.Reason, c.LastTransitionTime, c.Message)
}

// driftChecks is node's sidecar's dkc_sidecar_drift_checks_total by result, scraped from the node's address
// as Prometheus does, with token (dkc-metrics-reader).
func driftChecks(ctx context.Context, node, token string) (map[string]float64, error) {
	var ip string
	for _, n := range cluster.State().Nodes {
		if n.Name == node {
			ip = n.IP
		}
	}
	if ip == "" {
		return nil, fmt.Errorf("no node %s in the cluster's state", node)
	}
	url := "https://" + net.JoinHostPort(ip, strconv.Itoa(sidecarMetricsPort)) + "/metrics"
	code, body, err := scrape(ctx, url, token)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", url, code, body)
	}
	checks := map[string]float64{}
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(line, `dkc_sidecar_drift_checks_total{result="`)
		if !ok {
			continue
		}
		result, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			return nil, fmt.Errorf("GET %s: cannot read %q", url, line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("GET %s: %q: %w", url, line, err)
		}
		checks[result] = v
	}
	if len(checks) == 0 {
		return nil, fmt.Errorf("GET %s: no dkc_sidecar_drift_checks_total", url)
	}
	return checks, nil
}
