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

	"github.com/dkc-dev/dkc/api/v1alpha1"
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
	resetAfter(t)
	local := configzQPS(t, node)
	cm := createConfig(t, "installed-drift", node, 62)
	assign(t, node, cm)
	waitRunning(t, node, cm, 2*time.Minute)

	w := wiringOf(t, node)
	t.Cleanup(w.putBack) // before resetAfter's reset, which needs the wiring
	starts := kubeletStarts(t, node)
	w.remove()
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

	w.putBack()
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

// TestDriftRestoredOnceWithinThePool: a pool with drift.policy Restore over node-2. dkc's drop-in removed
// and the kubelet restarted by hand, the node's drift is reported, the pool asks its sidecar to repair it
// (the Node's dkc.dev/drift-repair), and the sidecar puts the drop-in back through the node's systemd and
// restarts the kubelet once: the kubelet runs the pool's config again after exactly one start besides the
// test's, and ConfigDrift turns False. Removed again, the same cause is reported and not repaired again
// (no loop): the pool says so, asks nothing more, and the kubelet is not restarted.
func TestDriftRestoredOnceWithinThePool(t *testing.T) {
	const node, pool = "node-2", "installed-restore"
	resetAfter(t)
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	createConfig(t, pool, node, 63)
	manifest := fmt.Sprintf(`apiVersion: dkc.dev/v1alpha1
kind: KubeletConfigPool
metadata:
  name: %s
spec:
  nodeSelector: {matchLabels: {kubernetes.io/hostname: %s}}
  configMap: {namespace: kube-system, name: %s, kubeletConfigKey: kubelet}
  drift: {policy: Restore}
`, pool, node, pool)
	file := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply the pool: %v\n%s", err, out)
	}
	if out, err := kubectlDKC(ctx, "rollout", pool, "--timeout", "4m"); err != nil ||
		!strings.Contains(out, "rollout complete") {
		t.Fatalf("kubectl dkc rollout %s: %v\n%s", pool, err, out)
	}
	waitRunning(t, node, snapshotCM(t, pool), time.Minute)

	w := wiringOf(t, node)
	t.Cleanup(w.putBack) // before deletePoolAtEnd and resetAfter, which need the wiring
	starts := kubeletStarts(t, node)
	w.remove()
	removedAt := time.Now()

	// The pool asks once the drift is reported; the sidecar repairs and the check after its restart finds
	// none. The request is what shows that the drift was seen: the sidecar may repair it within seconds.
	var asked nodeconfig.DriftRepair
	poll.ForNil(t, 2*time.Minute, time.Second, "the pool's request that "+node+" repair its drift", func() error {
		n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		r, ok := nodeconfig.DriftRepairOf(n)
		if !ok || r.RequestTime.Before(removedAt.Add(-time.Second)) {
			return fmt.Errorf("no request; pool %s", poolConditions(t, pool))
		}
		asked = r
		return nil
	})
	if asked.Cause != nodeconfig.DriftWiringRemoved {
		t.Errorf("the pool asked to repair %s, want the wiring (WiringRemoved)", asked.Cause)
	}
	// Reported within a minute, naming the wiring: the Event dkc-server records as the condition turns True.
	if d := asked.DriftSince.Sub(removedAt.Truncate(time.Second)); d > time.Minute {
		t.Errorf("drift reported %v after the kubelet's restart, want within a minute", d)
	}
	events, err := admin(t).CoreV1().Events(metav1.NamespaceDefault).List(ctxFor(t),
		metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + nodeconfig.DriftEventReason})
	if err != nil {
		t.Fatal(err)
	}
	named := false
	for _, e := range events.Items {
		named = named || (!e.LastTimestamp.Before(&metav1.Time{Time: removedAt.Truncate(time.Second)}) &&
			strings.HasPrefix(e.Message, nodeconfig.DriftWiringRemoved+": ") && strings.Contains(e.Message, nodeconfigDropIn))
	}
	if !named {
		t.Errorf("no %s Event on %s since the restart naming dkc's drop-in: %+v", nodeconfig.DriftEventReason, node, events.Items)
	}
	// A condition's lastTransitionTime has whole seconds.
	waitDrift(t, node, 2*time.Minute, func(c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionFalse && !c.LastTransitionTime.Time.Before(asked.RequestTime.Truncate(time.Second))
	})
	t.Logf("repaired %v after the kubelet's restart by hand (asked %v after it)", time.Since(removedAt).Round(time.Second),
		asked.RequestTime.Sub(removedAt).Round(time.Second))
	if got := configzQPS(t, node); got != 63 {
		t.Errorf("configz eventRecordQPS %v after the repair, want the pool's 63", got)
	}
	if got, err := os.ReadFile(w.path); err != nil || string(got) != string(w.content) {
		t.Errorf("dkc's drop-in after the repair: %v\n%s\nwant\n%s", err, got, w.content)
	}
	if d := kubeletStarts(t, node) - starts; d != 2 {
		t.Errorf("the kubelet started %d times since the drop-in was removed, want 2 (the test's, the repair's)", d)
	}

	// The same cause again: reported, not repaired again.
	starts = kubeletStarts(t, node)
	w.remove()
	waitDrift(t, node, 90*time.Second, func(c *corev1.NodeCondition) bool {
		return c != nil && c.Status == corev1.ConditionTrue
	})
	poll.ForNil(t, time.Minute, time.Second, "pool "+pool+" to say the drift is not repaired again", func() error {
		c := poolCondition(t, pool, v1alpha1.ConditionDrifted)
		// The pool's own words (the sidecar's note on the Node's condition says "not repaired again" too).
		if c == nil || !strings.Contains(c.Message, "found again after the repair the pool asked for") {
			return fmt.Errorf("pool %s", poolConditions(t, pool))
		}
		return nil
	})
	n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := nodeconfig.DriftRepairOf(n); !r.RequestTime.Equal(asked.RequestTime) {
		t.Errorf("the pool asked again at %v after the drift came back, want only its first request (%v)", r.RequestTime,
			asked.RequestTime)
	}
	// The drift is found from the unit's wiring, before the restarted kubelet logs its start: read the
	// starts once /configz answers, when it has.
	if got := configzQPS(t, node); got == 63 {
		t.Errorf("configz eventRecordQPS 63 with dkc's drop-in gone again: the drift the test made is not real")
	}
	if d := kubeletStarts(t, node) - starts; d != 1 {
		t.Errorf("the kubelet started %d times since the drop-in was removed again, want 1 (the test's)", d)
	}
}

// wiring is dkc's drop-in on a node, as installed, for a test that removes it.
type wiring struct {
	t       *testing.T
	node    string
	path    string
	content []byte
}

func wiringOf(t *testing.T, node string) *wiring {
	t.Helper()
	path := filepath.Join(cluster.KubeletDropInDir(node), filepath.Base(nodeconfigDropIn))
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("dkc's drop-in on %s: %v", node, err)
	}
	return &wiring{t: t, node: node, path: path, content: content}
}

// remove removes the drop-in and restarts the kubelet by hand, as a package upgrade replacing the unit's
// drop-ins would: systemd reloaded, the kubelet restarted onto the unit's own --config.
func (w *wiring) remove() {
	w.t.Helper()
	if err := os.Remove(w.path); err != nil {
		w.t.Fatal(err)
	}
	w.restartByHand()
}

// putBack puts the drop-in back, if it is not as installed, and restarts the kubelet by hand.
func (w *wiring) putBack() {
	w.t.Helper()
	if got, err := os.ReadFile(w.path); err == nil && string(got) == string(w.content) {
		return
	}
	if err := os.WriteFile(w.path, w.content, 0o644); err != nil {
		w.t.Fatal(err)
	}
	w.restartByHand()
}

func (w *wiring) restartByHand() {
	w.t.Helper()
	if err := cluster.DaemonReload(ctxFor(w.t), w.node); err != nil {
		w.t.Fatal(err)
	}
	if err := cluster.RestartUnit(ctxFor(w.t), w.node, "kubelet.service"); err != nil {
		w.t.Fatal(err)
	}
}

// poolCondition is the pool's condition of type typ; nil when it has none.
func poolCondition(t *testing.T, pool, typ string) *metav1.Condition {
	t.Helper()
	p := getPool(t, pool)
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// poolConditions are the pool's conditions, for a failure's message.
func poolConditions(t *testing.T, pool string) string {
	t.Helper()
	var out []string
	for _, c := range getPool(t, pool).Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(out, "; ")
}
