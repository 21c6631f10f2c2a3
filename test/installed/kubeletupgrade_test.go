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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/poll"
)

// lockedGate is a kubelet feature gate that kubelet 1.34 lets a config set (GA, not locked) and that is
// locked to its default (true) from 1.35: `featureGates: {ExecProbeTimeout: false}` runs on 1.34 (with a
// "Setting GA feature gate" warning) and makes a 1.35+ kubelet's config loading fail with "cannot set
// feature gate ExecProbeTimeout to false, feature is locked to true". A config an upgrade breaks.
const lockedGate = "ExecProbeTimeout"

// TestKubeletUpgradedInPlaceKeepsItsConfig: node-1 (the suite's oldest kubelet, 1.34) runs an assigned
// config that the control plane's minor (1.37) accepts as well. Before the upgrade, `kubectl dkc check
// --kubelet-version 1.37` says so for the node, and names the kubelet's refusal for a config that 1.34
// runs and 1.37 does not (in a paused pool that selects no node: check reads configs from pools and from
// what nodes run, not from a ConfigMap alone). Then node-1's kubelet binary is replaced in place, as a
// package upgrade replaces it, and the kubelet restarted by hand, as an operator does after the upgrade.
// The kubelet runs 1.37 with the assigned config, ConfigOK stays True, dkc's status shows the config
// active without error, the sidecar restarts nothing, and its drift check of the new start finds no drift.
func TestKubeletUpgradedInPlaceKeepsItsConfig(t *testing.T) {
	const node = "node-1"
	resetAfter(t)
	minors, _, _ := kubeletMinors(t)
	from, to := minors[node], cluster.KubeVersion()
	if checkapi.CompareMinors(from, to) >= 0 {
		t.Fatalf("node %s runs kubelet %s: this test upgrades it to the control plane's %s, so it needs an older one "+
			"(KUBELET_VERSIONS=%s=1.34)", node, from, to, node)
	}
	if checkapi.CompareMinors(from, "1.35") >= 0 || checkapi.CompareMinors(to, "1.35") < 0 {
		t.Fatalf("kubelet %s to %s: the config this test expects the upgrade to break (featureGates %s: false) needs "+
			"a kubelet older than 1.35 upgraded to 1.35 or newer; find another one", from, to, lockedGate)
	}
	// The token first: a scrape the apiserver refuses while the new binding is not in its RBAC cache yet
	// is cached as refused by the sidecar for a while; it is past by the time the baseline is scraped.
	token := serviceAccountToken(t, ctxFor(t), "kubelet-upgrade-metrics", "dkc-metrics-reader")

	cm := createConfig(t, "installed-upgrade-keeps", node, 64)
	assign(t, node, cm)
	waitRunning(t, node, cm, 3*time.Minute)
	if q := configzQPS(t, node); q != 64 {
		t.Fatalf("node %s (kubelet %s): configz eventRecordQPS = %v before the upgrade, want 64", node, from, q)
	}

	// Before the upgrade: check predicts that kubelet `to` runs node-1's config.
	out, err := kubectlDKC(ctxFor(t), "check", "--kubelet-version", to, node, "--kubelet-check-dir", cluster.KubeletCheckDir())
	t.Logf("kubectl dkc check --kubelet-version %s %s:\n%s", to, node, out)
	if err != nil {
		t.Fatalf("kubectl dkc check --kubelet-version %s %s: %v\n%s", to, node, err, out)
	}
	if row := checkRow(out, "node/"+node); !strings.Contains(row, "configmap kube-system/"+cm.Name) || !strings.Contains(row, " ok") {
		t.Errorf("kubectl dkc check --kubelet-version %s: row of node/%s %q; want its active %s ok", to, node, row, cm.Name)
	}

	// A config kubelet `from` runs and `to` refuses: the helpers of both minors (the code check runs) say
	// so, and so does check, for a pool holding it that selects no node and assigns nothing.
	refused := refusedAfterUpgradeConfig(t, node)
	helpers, err := configcheck.FindHelpers(cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("kubelet check helpers in %s: %v", cluster.KubeletCheckDir(), err)
	}
	if _, err := helpers.CheckData(ctxFor(t), "v"+from+".0", []byte(refused)); err != nil {
		t.Fatalf("kubelet %s's code refuses featureGates %s: false: %v; want it accepted", from, lockedGate, err)
	}
	refusedCM := createConfigData(t, "installed-upgrade-refused", refused)
	const pool = "installed-upgrade-preview"
	deletePoolAtEnd(t, pool)
	manifest := fmt.Sprintf(`apiVersion: dkc.dev/v1alpha1
kind: KubeletConfigPool
metadata:
  name: %s
spec:
  nodeSelector: {matchLabels: {dkc.dev/test-selects: none}}
  configMap: {namespace: kube-system, name: %s, kubeletConfigKey: kubelet}
  paused: true
`, pool, refusedCM.Name)
	file := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply pool %s: %v\n%s", pool, err, out)
	}
	// The pool's rows may say unknown for a moment: dkc-server snapshots the ConfigMap into a revision,
	// which check then reads.
	poll.ForNil(t, time.Minute, time.Second, fmt.Sprintf("kubectl dkc check --kubelet-version %s to refuse pool %s", to, pool),
		func() error {
			out, err = kubectlDKC(ctxFor(t), "check", "--kubelet-version", to, "--kubelet-check-dir", cluster.KubeletCheckDir())
			rows := checkRows(out, "pool/"+pool)
			if len(rows) == 0 || !errors.Is(err, plugin.ErrConfigsRefused) {
				return fmt.Errorf("want %w, got %w; output:\n%s", plugin.ErrConfigsRefused, err, out)
			}
			for _, r := range rows {
				if !strings.Contains(r, "refused:") || !strings.Contains(r, lockedGate) {
					return fmt.Errorf("row %q not refused for %s; output:\n%s", r, lockedGate, out)
				}
			}
			return nil
		})
	t.Logf("kubectl dkc check --kubelet-version %s:\n%s", to, out)
	if row := checkRow(out, "node/"+node); !strings.Contains(row, " ok") {
		t.Errorf("kubectl dkc check --kubelet-version %s: row of node/%s %q, want ok", to, node, row)
	}

	// The upgrade. Undone before resetAfter's reset (cleanups run last registered first), so that the
	// tests after this one find node-1 on its kubelet again (TestKubeletSkew needs the older minor).
	undo, err := cluster.ReplaceKubelet(ctxFor(t), node, to)
	if err != nil {
		t.Fatalf("upgrade node %s's kubelet to %s: %v", node, to, err)
	}
	t.Cleanup(func() { downgrade(t, node, from, undo) })
	pod := sidecarPod(t, node)
	const seenText = "kubelet started, not by the sidecar; checking it for drift"
	seenBefore := sidecarLogLines(t, node, pod, seenText)
	var checksBefore map[string]float64
	poll.ForNil(t, 2*time.Minute, time.Second, fmt.Sprintf("node %s's sidecar metrics", node), func() error {
		checksBefore, err = driftChecks(ctxFor(t), node, token)
		return err
	})
	starts := kubeletStarts(t, node)
	if err := cluster.RestartUnit(ctxFor(t), node, "kubelet.service"); err != nil {
		t.Fatalf("restart node %s's kubelet after the upgrade: %v", node, err)
	}
	waitKubeletMinor(t, node, to, 2*time.Minute)
	if got := lastKubeletVersionLogged(t, node); checkapi.Minor(got) != to {
		t.Errorf("node %s's kubelet logged %q as its version at its last start, want %s", node, got, to)
	}

	// The kubelet runs the assigned config, and dkc's status says so, with no error.
	poll.ForNil(t, time.Minute, time.Second, fmt.Sprintf("node %s's upgraded kubelet to serve /configz", node), func() error {
		_, err := admin(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctxFor(t))
		return err
	})
	if q := configzQPS(t, node); q != 64 {
		t.Errorf("node %s (kubelet %s): configz eventRecordQPS = %v after the upgrade, want the assigned config's 64", node, to, q)
	}
	waitRunning(t, node, cm, 2*time.Minute)

	// The sidecar sees a kubelet start it did not make and the new kubelet version dkc-server sends it, and
	// checks the kubelet for drift; the config runs as it should, so no check finds any.
	poll.ForNil(t, time.Minute, time.Second, fmt.Sprintf("node %s's sidecar %s to see the kubelet start and version %s", node, pod, to),
		func() error {
			if n := sidecarLogLines(t, node, pod, seenText); n <= seenBefore {
				return fmt.Errorf("%q logged %d times, as before the restart", seenText, n)
			}
			if n := sidecarLogLines(t, node, pod, `"msg":"kubelet version","node":"`+node+`","kubeletVersion":"v`+to+"."); n == 0 {
				return fmt.Errorf("no \"kubelet version\" v%s line in the sidecar's log yet", to)
			}
			return nil
		})
	var checks map[string]float64
	poll.ForNil(t, time.Minute, time.Second, fmt.Sprintf("a drift check on %s finding none after the upgrade", node), func() error {
		if checks, err = driftChecks(ctxFor(t), node, token); err != nil {
			return err
		}
		if checks["none"] > checksBefore["none"] {
			return nil
		}
		return fmt.Errorf("dkc_sidecar_drift_checks_total %v, before the restart %v", checks, checksBefore)
	})
	// The sidecar checks again at its next tick (10s) after it learns the new version, and reports only a
	// change: watch the Node for three ticks, that neither check turns ConfigDrift True nor ConfigOK False.
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if d := driftCondition(t, node); d != nil && d.Status == corev1.ConditionTrue {
			t.Fatalf("node %s: ConfigDrift True %s (%s) after the kubelet's upgrade to %s with a config it runs", node, d.Reason,
				d.Message, to)
		}
		if v := view(t, node); srcName(v.status.Active) != name(cm) || v.status.Error != "" || v.configOK == nil ||
			v.configOK.Status != corev1.ConditionTrue {
			t.Fatalf("node %s after the kubelet's upgrade to %s: %s; want %s active, no error, ConfigOK True", node, to, v, name(cm))
		}
	}
	if checks, err = driftChecks(ctxFor(t), node, token); err != nil {
		t.Fatal(err)
	}
	if checks["drift"] != checksBefore["drift"] {
		t.Errorf("node %s: drift checks since the upgrade %v, before %v; want none finding drift", node, checks, checksBefore)
	}
	t.Logf("node %s on kubelet %s: %s; drift checks %v (before the upgrade %v); ConfigDrift %s", node, to, view(t, node),
		checks, checksBefore, describeCondition(driftCondition(t, node)))
	if d := kubeletStarts(t, node) - starts; d != 1 {
		t.Errorf("node %s's kubelet started %d times after the upgrade, want 1 (the test's restart; the sidecar restarts nothing)", node, d)
	}
}

// refusedAfterUpgradeConfig is node's local config with the locked gate set to what only older kubelets
// accept.
func refusedAfterUpgradeConfig(t *testing.T, node string) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, node, 65)), &m); err != nil {
		t.Fatal(err)
	}
	m["featureGates"] = map[string]any{lockedGate: false}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// downgrade undoes the in-place upgrade (ReplaceKubelet's undo), restarts the kubelet on its own binary
// again and waits until the Node reports minor.
func downgrade(t *testing.T, node, minor string, undo func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := undo(ctx); err != nil {
		t.Errorf("undo the upgrade of node %s's kubelet: %v", node, err)
		return
	}
	if err := cluster.RestartUnit(ctx, node, "kubelet.service"); err != nil {
		t.Errorf("restart node %s's kubelet after undoing its upgrade: %v", node, err)
		return
	}
	waitKubeletMinor(t, node, minor, 2*time.Minute)
}

// waitKubeletMinor waits until node's Node reports a kubelet of minor (status.nodeInfo.kubeletVersion).
func waitKubeletMinor(t *testing.T, node, minor string, timeout time.Duration) {
	t.Helper()
	poll.ForNil(t, timeout, time.Second, fmt.Sprintf("node %s to report kubelet %s", node, minor), func() error {
		n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := n.Status.NodeInfo.KubeletVersion; checkapi.Minor(got) != minor {
			return fmt.Errorf("node %s reports kubelet %s", node, got)
		}
		return nil
	})
}

// lastKubeletVersionLogged is the version node's kubelet logged at its last start ("Kubelet version").
func lastKubeletVersionLogged(t *testing.T, node string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(cluster.NodeLogDir(node), "kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	version := ""
	for line := range strings.Lines(string(raw)) {
		if _, v, ok := strings.Cut(line, `"Kubelet version" kubeletVersion="`); ok {
			version, _, _ = strings.Cut(v, `"`)
		}
	}
	return version
}

// checkRows are the rows of `kubectl dkc check`'s table for object (pool/NAME, node/NAME).
func checkRows(table, object string) []string {
	var rows []string
	for line := range strings.Lines(table) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == object {
			rows = append(rows, strings.TrimSpace(line))
		}
	}
	return rows
}

// checkRow is object's one row of check's table, "" without one.
func checkRow(table, object string) string {
	rows := checkRows(table, object)
	if len(rows) != 1 {
		return strings.Join(rows, "\n")
	}
	return rows[0]
}
