// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestAConfigThatFailsPodsWaitsForADrain: the worker runs its local config, which no pool knows, and a
// Deployment's pod behind a PodDisruptionBudget that allows no disruption. A config whose maxPods is one
// below the pods running there would have the restarted kubelet re-admit them oldest first and fail the
// newest, the Deployment's pod, with OutOfpods:
//   - kubectl dkc assign refuses it unless asked to drain, naming the pod;
//   - assigned through the annotation, the node's sidecar plays the same admission from the Node's capacity
//     (which dkc-server sends it), its kubelet's /configz and /pods, refuses the config before touching the
//     kubelet and says the node must be drained first, naming the pod;
//   - a pool that may drain, over the worker on its local config (whose running config the pool controller
//     cannot know), has the node drained on the sidecar's word: the budget holds the eviction back and the
//     kubelet is not restarted meanwhile; relaxed, the pod moves to the other node, the kubelet restarts
//     once and runs the config, the node is uncordoned, and the kubelet never denied a pod admission.
func TestAConfigThatFailsPodsWaitsForADrain(t *testing.T) {
	worker := workerNode()
	other := cluster.ControlPlaneNode()
	resetAfter(t)
	t.Cleanup(func() { undrain(t, worker) })
	const ns, pool = "admission", "admission-pool"
	deletePoolAtEnd(t, pool) // runs before undrain and the reset: the pool would assign the node again
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := admin(t)
	denials := kubeletLogCount(t, worker, denied)
	before := webBehindABudget(ctx, t, ns, worker)
	live := livePods(ctx, t, worker)
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, worker, 49)), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["maxPods"] = live - 1
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cm := createConfigData(t, "installed-admission", string(raw))
	rejected := fmt.Sprintf("%s/%s", ns, before.Name)
	outOf := fmt.Sprintf("pod %d of %d allowed (OutOfpods)", live, live-1)

	// kubectl dkc assign, without --drain, refuses it before writing anything.
	out, err := kubectlDKC(ctx, "assign", worker, "--configmap", "kube-system/"+cm.Name, "--kubelet-check-dir",
		cluster.KubeletCheckDir())
	if err == nil || !strings.Contains(err.Error(), worker+": "+rejected+": "+outOf) ||
		!strings.Contains(err.Error(), "nothing was assigned") {
		t.Errorf("kubectl dkc assign without --drain: %v, want a refusal naming %s and %q\n%s", err, rejected, outOf, out)
	}
	if got := srcName(view(t, worker).status.Assigned); got != "local" {
		t.Errorf("%s assigned %s after assign refused", worker, got)
	}

	// Through the annotation, which no CLI checks: the sidecar predicts the same and leaves the kubelet alone.
	refusedUndrained(t, worker, cm, rejected+": "+outOf, "would stop 1 of them", "--drain")
	stillRunning(ctx, t, ns, before.Name)

	// A pool that may drain: the sidecar's refusal has the node drained, past the budget only once relaxed.
	starts := kubeletStarts(t, worker)
	drainingPool(ctx, t, pool, worker, cm)
	if p, err := c.CoreV1().Pods(ns).Get(ctx, before.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("pod %s evicted though its budget allows no disruption (%v)", before.Name, err)
	}
	if got := kubeletStarts(t, worker); got != starts {
		t.Errorf("%s: the kubelet started %d times before the node was drained, want 0", worker, got-starts)
	}
	relaxBudget(ctx, t, ns)
	released(t, worker)
	snap := snapshotCM(t, pool)
	if v := view(t, worker); srcName(v.status.Active) != name(snap) || v.status.Error != "" {
		t.Errorf("%s released while it does not run the revision: %s", worker, v)
	}
	if after := webPod(t, ns, other, 3*time.Minute); after.Name == before.Name {
		t.Errorf("pod %s still runs; want it evicted and replaced on %s", before.Name, other)
	}
	if got := configzField(t, worker, "maxPods"); got != fmt.Sprint(live-1) {
		t.Errorf("%s: /configz says maxPods %v, want %d", worker, got, live-1)
	}
	if got := kubeletStarts(t, worker) - starts; got != 1 {
		t.Errorf("%s: the kubelet started %d times for the revision, want once", worker, got)
	}
	// The kubelet's log, not the API: a pause pod it rejects exits 0 and shows Succeeded there.
	if got := kubeletLogCount(t, worker, denied) - denials; got != 0 {
		t.Errorf("%s: the kubelet denied admission to %d pods since the test began, want none", worker, got)
	}
}

// denied is what the kubelet logs for each pod it rejects, a running one it admits again included: e.g.
// "Pod admission denied" pod="verify/web-869777f449-8jhkw" reason="OutOfpods" (docs/results.md).
const denied = `"Pod admission denied"`
