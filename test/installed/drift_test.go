// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
)

// TestDriftReportedWhenTheWiringIsRemoved: dkc's drop-in removed and the kubelet restarted by hand — what a
// kubelet package upgrade that replaces the unit's drop-ins does — really puts the kubelet back on the node's
// local config; the node's sidecar reports it within a minute as the Node's ConfigDrift condition naming the
// wiring, dkc-server records a KubeletConfigDrifted Event, and `kubectl dkc status` shows the cause. The
// drop-in put back and the kubelet restarted again, the kubelet runs the assigned config and the condition
// turns False (NoDrift). The sidecar restarts nothing itself: no repair is configured.
func TestDriftReportedWhenTheWiringIsRemoved(t *testing.T) {
	const node = "node-2"
	diagnoseOnFailure(t)
	resetAfter(t)
	local := configzQPS(t, node)
	cm := createConfig(t, "installed-drift", node, 62)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)

	dropIn := filepath.Join(cluster.KubeletDropInDir(node), filepath.Base(nodeconfigDropIn))
	content, err := os.ReadFile(dropIn)
	if err != nil {
		t.Fatalf("dkc's drop-in on %s: %v", node, err)
	}
	restartByHand := func() {
		t.Helper()
		if err := cluster.DaemonReload(ctxFor(t), node); err != nil {
			t.Fatal(err)
		}
		if err := cluster.RestartUnit(ctxFor(t), node, "kubelet.service"); err != nil {
			t.Fatal(err)
		}
	}
	restored := false
	restore := func() {
		t.Helper()
		if restored {
			return
		}
		restored = true
		if err := os.WriteFile(dropIn, content, 0o644); err != nil {
			t.Fatal(err)
		}
		restartByHand()
	}
	t.Cleanup(restore) // before resetAfter's reset, which needs the wiring
	if err := os.Remove(dropIn); err != nil {
		t.Fatal(err)
	}
	starts := kubeletStarts(t, node)
	restartByHand()
	removedAt := time.Now()

	drift := waitDrift(t, node, time.Minute+30*time.Second, func(c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionTrue
	})
	t.Logf("drift reported %v after the kubelet's restart: %s %s", time.Since(removedAt).Round(time.Second), drift.Reason,
		drift.Message)
	if drift.Reason != nodeconfig.DriftWiringRemoved && drift.Reason != nodeconfig.DriftWiringReplaced {
		t.Errorf("ConfigDrift reason %s (%s), want the wiring named (WiringRemoved)", drift.Reason, drift.Message)
	}
	// The drift is real: without dkc's drop-in the kubelet runs the unit's own --config, the local one.
	if got := configzQPS(t, node); got != local {
		t.Errorf("configz eventRecordQPS %v with dkc's drop-in gone, want the local config's %v", got, local)
	}
	// dkc-server records the Event after it wrote the condition: the test may look in between.
	poll.ForNil(t, 30*time.Second, time.Second, fmt.Sprintf("a %s Warning Event on %s", nodeconfig.DriftEventReason, node),
		func() error {
			events, err := admin(t).CoreV1().Events(metav1.NamespaceDefault).List(ctxFor(t),
				metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + nodeconfig.DriftEventReason})
			if err != nil {
				return err
			}
			for _, e := range events.Items {
				if e.Type == corev1.EventTypeWarning {
					return nil
				}
			}
			return fmt.Errorf("events: %+v", events.Items)
		})
	if out, err := kubectlDKC(ctxFor(t), "status", node); err != nil || !strings.Contains(out, drift.Reason) {
		t.Errorf("kubectl dkc status %s shows no drift cause %s: %v\n%s", node, drift.Reason, err, out)
	}

	restore()
	waitDrift(t, node, 2*time.Minute, func(c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == nodeconfig.DriftNone
	})
	if got := configzQPS(t, node); got != 62 {
		t.Errorf("configz eventRecordQPS %v with dkc's drop-in back, want the assigned config's 62", got)
	}
	// Two starts, both the test's: the sidecar repaired nothing on its own.
	if d := kubeletStarts(t, node) - starts; d != 2 {
		t.Errorf("the kubelet started %d times after the drop-in was removed, want 2 (the test's restarts)", d)
	}
}

// nodeconfigDropIn is where the DaemonSet installs dkc's drop-in (sidecar/internal/uninstall.DefaultDropIn).
const nodeconfigDropIn = "/etc/systemd/system/kubelet.service.d/20-dkc.conf"

// waitDrift waits until node's ConfigDrift condition satisfies ok and returns it.
func waitDrift(t *testing.T, node string, timeout time.Duration, ok func(*corev1.NodeCondition) bool) corev1.NodeCondition {
	t.Helper()
	var found *corev1.NodeCondition
	poll.ForNil(t, timeout, time.Second, fmt.Sprintf("node %s's ConfigDrift condition", node), func() error {
		n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		found = nil
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == nodeconfig.DriftConditionType {
				found = &n.Status.Conditions[i]
			}
		}
		if ok(found) {
			return nil
		}
		if found == nil {
			return errors.New("no ConfigDrift condition; " + view(t, node).String())
		}
		return fmt.Errorf("ConfigDrift %s %s: %s; %s", found.Status, found.Reason, found.Message, view(t, node))
	})
	return *found
}
