// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/poll"
)

// TestANewEvictionThresholdWaitsForADrain: the worker runs a Deployment's BestEffort pod behind a
// PodDisruptionBudget that allows no disruption. A config whose hard memory.available eviction threshold is
// 2Gi above what the worker has available now (its stats summary):
//   - `kubectl dkc diff` and `rollout --dry-run` say the node is below it and name the pod as one the
//     restarted kubelet would stop (rejected as it admits the pod again under MemoryPressure), and not the
//     sidecar (critical);
//   - kubectl dkc assign refuses it unless asked to drain;
//   - assigned through the annotation, the node's sidecar makes the same prediction from its own kubelet's
//     /stats/summary and /pods, refuses the config before touching the kubelet and says the node must be
//     drained first, naming the pod: the kubelet's eviction manager would stop it past its budget;
//   - kubectl dkc assign --drain evicts it through the Eviction API only once the budget allows it, and the
//     kubelet then restarts once, runs the config and reports MemoryPressure, as predicted.
//
// (That the restarted kubelet stops exactly the predicted pod, with reason Evicted, was checked against the
// kubelet's log when the prediction was built: docs/results.md, fd65c0d.)
func TestANewEvictionThresholdWaitsForADrain(t *testing.T) {
	worker := workerNode()
	other := cluster.ControlPlaneNode()
	// After the reset (cleanups run last first): the worker's MemoryPressure gone, its taint with it, before
	// the next test schedules there.
	t.Cleanup(func() {
		poll.ForNil(t, 6*time.Minute, time.Second, worker+" without MemoryPressure", func() error {
			n, err := admin(t).CoreV1().Nodes().Get(context.Background(), worker, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if c := memoryPressure(n); c != nil && c.Status != corev1.ConditionFalse {
				return fmt.Errorf("MemoryPressure %s: %s", c.Status, c.Message)
			}
			return nil
		})
	})
	resetAfter(t)
	t.Cleanup(func() { undrain(t, worker) })
	const ns = "eviction"
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := admin(t)
	before := webBehindABudget(ctx, t, ns, worker)
	var summary statsapi.Summary
	poll.ForNil(t, 2*time.Minute, time.Second, "the worker's stats summary to show the pod's memory", func() error {
		raw, err := c.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", worker, "proxy", "stats", "summary").DoRaw(ctx)
		if err != nil {
			return err
		}
		summary = statsapi.Summary{}
		if err := json.Unmarshal(raw, &summary); err != nil {
			return err
		}
		for _, p := range summary.Pods {
			if p.PodRef.Namespace == ns && p.PodRef.Name == before.Name && p.Memory != nil && p.Memory.WorkingSetBytes != nil {
				return nil
			}
		}
		return fmt.Errorf("no memory stats of %s/%s yet", ns, before.Name)
	})
	if summary.Node.Memory == nil || summary.Node.Memory.AvailableBytes == nil {
		t.Fatalf("the worker's summary has no memory.available: %+v", summary.Node.Memory)
	}
	threshold := (*summary.Node.Memory.AvailableBytes + 2<<30) >> 20 // Mi
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, worker, 42)), &cfg); err != nil {
		t.Fatal(err)
	}
	hard, _ := cfg["evictionHard"].(map[string]any)
	if hard == nil {
		hard = map[string]any{}
	}
	hard["memory.available"] = fmt.Sprintf("%dMi", threshold)
	cfg["evictionHard"] = hard
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cm := createConfigData(t, "installed-eviction", string(raw))

	pressure := fmt.Sprintf("%s: memory.available ", worker)
	below := fmt.Sprintf("is below the new hard eviction threshold %dMi", threshold)
	evicted := fmt.Sprintf("%s: %s/%s may be rejected (Evicted) when the restarted kubelet admits it again "+
		"under MemoryPressure", worker, ns, before.Name)
	out, err := kubectlDKC(ctx, "diff", worker, "--configmap", "kube-system/"+cm.Name, "--kubelet-check-dir",
		cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("kubectl dkc diff: %v\n%s", err, out)
	}
	for _, want := range []string{pressure, below, evicted} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "dkc-sidecar") {
		t.Errorf("diff names the sidecar, which is critical and never evicted:\n%s", out)
	}
	t.Logf("kubectl dkc diff:\n%s", out)
	out, err = kubectlDKC(ctx, "rollout", "eviction-preview", "--dry-run", "--configmap", "kube-system/"+cm.Name,
		"-l", corev1.LabelHostname+"="+worker, "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err != nil || !strings.Contains(out, evicted) || !strings.Contains(out, "EVICTED") {
		t.Errorf("kubectl dkc rollout --dry-run: %v, want the EVICTED column and %q\n%s", err, evicted, out)
	}

	// kubectl dkc assign, without --drain, refuses it before writing anything.
	out, err = kubectlDKC(ctx, "assign", worker, "--configmap", "kube-system/"+cm.Name, "--kubelet-check-dir",
		cluster.KubeletCheckDir())
	if err == nil || !strings.Contains(err.Error(), evicted) || !strings.Contains(err.Error(), "nothing was assigned") {
		t.Errorf("kubectl dkc assign without --drain: %v, want a refusal naming %q\n%s", err, evicted, out)
	}
	if got := srcName(view(t, worker).status.Assigned); got != "local" {
		t.Errorf("%s assigned %s after assign refused", worker, got)
	}

	// Through the annotation, which no CLI checks: the sidecar predicts the same and leaves the kubelet alone.
	starts := kubeletStarts(t, worker)
	refusedUndrained(t, worker, cm, pressure, below, evicted, "honours no PodDisruptionBudget", "--drain")
	stillRunning(ctx, t, ns, before.Name)

	// --drain: the budget holds the eviction back, the kubelet the restart.
	relax := drainBlockedByBudget(ctx, t, worker, ns, cm)
	startsBeforeDrain := kubeletStarts(t, worker)
	if startsBeforeDrain != starts {
		t.Errorf("%s: the kubelet started %d times before the node was drained, want 0", worker, startsBeforeDrain-starts)
	}
	relax()
	if after := webPod(t, ns, other, 3*time.Minute); after.Name == before.Name {
		t.Errorf("pod %s still runs; want it evicted and replaced on %s", before.Name, other)
	}
	if got := kubeletStarts(t, worker) - startsBeforeDrain; got != 1 {
		t.Errorf("%s: the kubelet started %d times for the change, want once", worker, got)
	}
	waitRunning(t, worker, cm, time.Minute)
	poll.ForNil(t, 2*time.Minute, time.Second, worker+" under MemoryPressure, as predicted", func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, worker, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p := memoryPressure(n); p == nil || p.Status != corev1.ConditionTrue {
			return fmt.Errorf("MemoryPressure %+v", p)
		}
		return nil
	})
	released(t, worker)
}

func memoryPressure(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeMemoryPressure {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
