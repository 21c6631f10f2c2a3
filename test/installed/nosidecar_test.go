// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// TestPoolOverANodeWithoutASidecarCompletes: a pool whose selector picks only nodes the sidecar DaemonSet
// does not run on — a Windows Node, and a Node whose sidecar never reported (a Node object without the
// os label, which the DaemonSet's nodeSelector skips) — settles at once with both held, assigns neither,
// and `kubectl dkc rollout` exits 0. Both are Ready. (Before, the pool assigned them, they never answered,
// and the rollout waited for nodeTimeout and halted the pool.)
func TestPoolOverANodeWithoutASidecarCompletes(t *testing.T) {
	const pool, label = "installed-nosidecar", "dkc.dev/test-nosidecar"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for name, lbls := range map[string]map[string]string{
		"installed-windows-1":  {label: "yes", corev1.LabelOSStable: "windows"},
		"installed-unreported": {label: "yes"},
	} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
		if _, err := admin(t).CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		t.Cleanup(func() { _ = admin(t).CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		// Ready, as a healthy node is: a pool assigns only Ready nodes, and these must be held for having no
		// sidecar, not skipped for being down.
		now := metav1.Now()
		ready, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "a Node object without a sidecar",
			LastHeartbeatTime: now, LastTransitionTime: now}}}})
		if _, err := admin(t).CoreV1().Nodes().PatchStatus(ctx, name, ready); err != nil {
			t.Fatalf("mark node %s Ready: %v", name, err)
		}
	}
	deletePoolAtEnd(t, pool)
	createConfig(t, pool, "node-1", 44)

	out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/"+pool, "-l", label+"=yes", "--timeout", "2m")
	if err != nil || !strings.Contains(out, "nothing more to assign") {
		t.Fatalf("kubectl dkc rollout: %v\n%s", err, out)
	}
	p := getPool(t, pool)
	var held []string
	for _, h := range p.Status.HeldNodes {
		held = append(held, h.Name+":"+h.Reason)
	}
	slices.Sort(held)
	if p.Status.Nodes.Held != 2 || strings.Join(held, ",") != "installed-unreported:NotReported,installed-windows-1:NoSidecar" {
		t.Errorf("held %d %v, want installed-unreported NotReported and installed-windows-1 NoSidecar", p.Status.Nodes.Held, held)
	}
	if len(p.Status.FailedNodes) > 0 || p.Status.Nodes.InProgress > 0 {
		t.Errorf("failed %v, %d in progress; want neither", p.Status.FailedNodes, p.Status.Nodes.InProgress)
	}
	for _, name := range []string{"installed-windows-1", "installed-unreported"} {
		n, err := admin(t).CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if src, ok := n.Annotations[nodeconfig.SourceAnnotation]; ok {
			t.Errorf("node %s was assigned %s", name, src)
		}
		if _, ok := n.Annotations[v1alpha1.AnnotationAssignment]; ok {
			t.Errorf("node %s has a pool assignment record", name)
		}
	}
	status, err := kubectlDKC(ctx, "rollout", "status", pool, "--wait=false")
	if err != nil || !strings.Contains(status, "2 held (1 NoSidecar, 1 NotReported)") || !strings.Contains(status, "installed-windows-1") {
		t.Errorf("kubectl dkc rollout status: %v\n%s", err, status)
	}
}
