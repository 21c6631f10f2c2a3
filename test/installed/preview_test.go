// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
)

// TestPoolPreviewsOnANodeItCannotJudge: the worker runs its local config, which no pool knows, so the pool
// controller cannot tell from here what a new config would do there. A pool (drain Never) whose config has
// maxPods one below the pods running on the worker asks the worker's sidecar first: its ConfigPreview
// condition names the pod the restarted kubelet would fail (OutOfpods), the pool's Previewed condition
// repeats it, and the pool refuses the revision (ConfigInvalid CapacityRefused) — the worker is never
// assigned and its kubelet never restarted. An edit that leaves room for the pods is previewed clean
// (Previewed True) and rolls out.
func TestPoolPreviewsOnANodeItCannotJudge(t *testing.T) {
	resetAfter(t)
	const pool, ns = "installed-preview", "preview"
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	worker := workerNode()
	web := webBehindABudget(ctx, t, ns, worker)
	live := livePods(ctx, t, worker)
	withMaxPods := func(n int) string {
		var cfg map[string]any
		if err := yaml.Unmarshal([]byte(nodeConfig(t, worker, 47)), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg["maxPods"] = n
		raw, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	cm := createConfigData(t, pool, withMaxPods(live-1))
	since := time.Now()
	out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/"+cm.Name, "-l",
		corev1.LabelHostname+"="+worker, "--timeout", "3m")
	var stopped *plugin.ErrRolloutStopped
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonCapacityRefused {
		t.Fatalf("rollout of maxPods %d below the %d pods on %s (local config): %v, want ConfigInvalid %s\n%s",
			live-1, live, worker, err, v1alpha1.ReasonCapacityRefused, out)
	}
	pod := web.Namespace + "/" + web.Name
	for _, w := range []string{worker, pod, "OutOfpods", "nothing is assigned"} {
		if !strings.Contains(stopped.Message, w) {
			t.Errorf("CapacityRefused message lacks %q: %s", w, stopped.Message)
		}
	}
	t.Logf("refused on the preview: %s", stopped.Message)
	p := getPool(t, pool)
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionPreviewed); c == nil ||
		c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonNodesAffected || !strings.Contains(c.Message, pod) {
		t.Errorf("Previewed %+v, want False %s naming %s", c, v1alpha1.ReasonNodesAffected, pod)
	}
	if p.Status.Preview == nil || p.Status.Preview.CompletionTime == nil {
		t.Errorf("status.preview %+v, want completed", p.Status.Preview)
	}
	if c := previewCondition(t, worker); c == nil || c.Status != corev1.ConditionFalse ||
		c.Reason != nodeconfig.PreviewPodsAffected || !strings.Contains(c.Message, pod) ||
		!strings.Contains(c.Message, "of pool "+pool) {
		t.Errorf("%s ConfigPreview %+v, want False %s naming %s and the pool", worker, c, nodeconfig.PreviewPodsAffected, pod)
	}
	if v := view(t, worker); srcName(v.status.Assigned) != "local" {
		t.Errorf("%s assigned %s after the pool refused its revision", worker, srcName(v.status.Assigned))
	}
	if s := startsSince(t, worker, since); len(s) != 0 {
		t.Errorf("%s: kubelet started %v for a config that fails its pods", worker, s)
	}
	stillRunning(ctx, t, ns, web.Name)

	// Room for the pods: previewed clean, then rolled out.
	editConfig(t, cm, withMaxPods(live+20))
	out, err = kubectlDKC(ctx, "rollout", pool, "--timeout", "5m")
	if err != nil || !strings.Contains(out, "rollout complete: 1 nodes run revision") {
		t.Fatalf("kubectl dkc rollout after the edit: %v\n%s", err, out)
	}
	p = getPool(t, pool)
	if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionPreviewed); c == nil ||
		c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonNoPodsAffected ||
		!strings.Contains(c.Message, p.Status.CurrentRevision) {
		t.Errorf("Previewed %+v after the edit, want True %s for revision %s", c, v1alpha1.ReasonNoPodsAffected,
			p.Status.CurrentRevision)
	}
	if got := configzField(t, worker, "maxPods"); got != fmt.Sprint(live+20) {
		t.Errorf("%s: /configz says maxPods %v, want %d", worker, got, live+20)
	}
}

// previewCondition is node's ConfigPreview condition, nil when it has none.
func previewCondition(t *testing.T, node string) *corev1.NodeCondition {
	t.Helper()
	var got *corev1.NodeCondition
	poll.ForNil(t, 30*time.Second, 300*time.Millisecond, "read "+node, func() error {
		n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == nodeconfig.PreviewConditionType {
				got = &n.Status.Conditions[i]
			}
		}
		return nil
	})
	return got
}
