// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/poll"
)

// TestKubeletUpgradedInPlaceToAMinorThatRefusesItsConfig: node-1 (kubelet 1.34) runs an assigned config
// with featureGates {ExecProbeTimeout: false}, which 1.35 and later refuse (the gate is locked to true).
// Its kubelet binary is replaced in place by the control plane's minor and the kubelet restarted by hand:
// the kubelet exits at every start until systemd gives up on the unit, and never registers, so the Node
// still says 1.34 and dkc-server cannot tell the sidecar anything (both its replicas run on node-1, and are
// not ready meanwhile). The sidecar finds it alone: it asks the binary the kubelet unit starts for its
// version through the node's systemd, checks the config with that minor's code, which refuses it, and falls
// back to the node's local config with one restart. Then the kubelet runs the new minor on its local
// config, the Node says so, its ConfigOK is False naming the new minor and the kubelet's error, `kubectl dkc
// status` shows it, and the sidecar restarts nothing more.
func TestKubeletUpgradedInPlaceToAMinorThatRefusesItsConfig(t *testing.T) {
	const node = "node-1"
	resetAfter(t)
	minors, _, _ := kubeletMinors(t)
	from, to := minors[node], cluster.KubeVersion()
	if checkapi.CompareMinors(from, "1.35") >= 0 || checkapi.CompareMinors(to, "1.35") < 0 {
		t.Fatalf("kubelet %s to %s: featureGates %s: false must run before the upgrade and be refused after it, "+
			"which needs a kubelet older than 1.35 upgraded to 1.35 or newer (KUBELET_VERSIONS=%s=1.34)", from, to,
			lockedGate, node)
	}
	localQPS := localEventRecordQPS(t, node)
	cm := createConfigData(t, "installed-upgrade-refusing", refusedAfterUpgradeConfig(t, node)) // eventRecordQPS 65
	assign(t, node, cm)
	waitRunning(t, node, cm, 3*time.Minute)
	if q := configzQPS(t, node); q != 65 || localQPS == 65 {
		t.Fatalf("node %s (kubelet %s): configz eventRecordQPS = %v before the upgrade, want the assigned config's 65 "+
			"(the local config's: %v)", node, from, q, localQPS)
	}

	undo, err := cluster.ReplaceKubelet(ctxFor(t), node, to)
	if err != nil {
		t.Fatalf("upgrade node %s's kubelet to %s: %v", node, to, err)
	}
	t.Cleanup(func() { downgrade(t, node, from, undo) })
	pod := sidecarPod(t, node)
	const restartText = `"msg":"restarting kubelet to use config"`
	const foundText = `"msg":"kubelet upgraded in place: the binary its unit starts is of another minor`
	restartsBefore := sidecarLogLines(t, node, pod, restartText)
	starts := kubeletStarts(t, node)
	// The restart job may fail, the kubelet exiting at once: what follows is what matters.
	if err := cluster.RestartUnit(ctxFor(t), node, "kubelet.service"); err != nil {
		t.Logf("restart node %s's kubelet after the upgrade: %v", node, err)
	}

	// The sidecar finds the upgrade by itself and falls back to the local config; the new kubelet registers.
	poll.ForNil(t, 4*time.Minute, time.Second, fmt.Sprintf("node %s's sidecar %s to find the kubelet upgraded to %s", node,
		pod, to), func() error {
		if n := sidecarLogLines(t, node, pod, foundText); n == 0 {
			return fmt.Errorf("no %s line in the sidecar's log yet", foundText)
		}
		return nil
	})
	waitKubeletMinor(t, node, to, 3*time.Minute)
	poll.ForNil(t, time.Minute, time.Second, fmt.Sprintf("node %s's upgraded kubelet to serve /configz", node), func() error {
		_, err := admin(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctxFor(t))
		return err
	})
	if q := configzQPS(t, node); q != localQPS {
		t.Errorf("node %s (kubelet %s): configz eventRecordQPS = %v after the upgrade, want the local config's %v", node,
			to, q, localQPS)
	}
	if got := lastKubeletVersionLogged(t, node); checkapi.Minor(got) != to {
		t.Errorf("node %s's kubelet logged %q as its version at its last start, want %s", node, got, to)
	}

	// The status: the local config active, the assigned one refused by the new minor, with the kubelet's error.
	var v nodeView
	poll.ForNil(t, 2*time.Minute, time.Second, fmt.Sprintf("node %s's ConfigOK False naming %s and %s", node, to, lockedGate),
		func() error {
			v = view(t, node)
			if c := v.configOK; c == nil || c.Status != corev1.ConditionFalse ||
				!strings.Contains(c.Message, "kubelet upgraded in place from "+from+" to "+to+", which refuses configmap kube-system/"+cm.Name) ||
				!strings.Contains(c.Message, "cannot set feature gate "+lockedGate+" to false") ||
				!strings.Contains(c.Message, "running the node's local config") {
				return fmt.Errorf("%s", v)
			}
			if srcName(v.status.Assigned) != name(cm) || srcName(v.status.Active) != "local" || v.status.Error == "" {
				return fmt.Errorf("%s; want %s assigned, local active, an error", v, name(cm))
			}
			return nil
		})
	t.Logf("node %s on kubelet %s: %s", node, to, v)
	out, err := kubectlDKC(ctxFor(t), "status", node, "-o", "json")
	if err != nil || !strings.Contains(out, "upgraded in place from "+from+" to "+to) || !strings.Contains(out, lockedGate) {
		t.Errorf("kubectl dkc status %s -o json does not show the upgrade to %s refusing the config: %v\n%s", node, to, err, out)
	}
	if out, err := kubectlDKC(ctxFor(t), "status", node); err != nil || !strings.Contains(out, v.status.Error) {
		t.Errorf("kubectl dkc status %s does not show the error %q: %v\n%s", node, v.status.Error, err, out)
	} else {
		t.Logf("kubectl dkc status %s:\n%s", node, out)
	}

	// One restart by the sidecar, into the local config, and no more: watch three of its ticks.
	time.Sleep(30 * time.Second)
	if n := sidecarLogLines(t, node, pod, restartText) - restartsBefore; n != 1 {
		t.Errorf("node %s's sidecar restarted the kubelet %d times after the upgrade, want 1 (into the local config)", node, n)
	}
	if n := sidecarLogLines(t, node, pod, foundText); n != 1 {
		t.Errorf("node %s's sidecar found the upgrade %d times, want once", node, n)
	}
	if v2 := view(t, node); srcName(v2.status.Active) != "local" || v2.configOK == nil || v2.configOK.Status != corev1.ConditionFalse {
		t.Errorf("node %s 30s later: %s; want still local, ConfigOK False", node, v2)
	}
	t.Logf("node %s's kubelet started %d times since the upgrade (the test's restart, systemd's restarts of it, the "+
		"sidecar's one)", node, kubeletStarts(t, node)-starts)
}

// localEventRecordQPS is node's local config's eventRecordQPS (the kubelet's default, 50, if it sets none).
func localEventRecordQPS(t *testing.T, node string) float64 {
	t.Helper()
	raw, err := os.ReadFile(cluster.KubeletConfigPath(node))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		EventRecordQPS *float64 `json:"eventRecordQPS"`
	}
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m.EventRecordQPS == nil {
		return 50
	}
	return *m.EventRecordQPS
}
