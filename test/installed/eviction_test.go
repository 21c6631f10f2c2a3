// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// TestDiffNamesThePodsANewEvictionThresholdEvicts: a config whose hard memory.available eviction threshold
// is 2Gi above what the worker has available now (its stats summary) — `kubectl dkc diff` and `rollout
// --dry-run` say the node is below it and name the workload's BestEffort pod as one the kubelet would stop
// (rejected as it admits the pod again under MemoryPressure), and not the sidecar (critical). Checked
// against the kubelet: assigned, the restarted kubelet stops exactly that pod with reason Evicted (its log
// says so; the API may show the pod Succeeded, as pause exits 0 on SIGTERM) and keeps the sidecar.
func TestDiffNamesThePodsANewEvictionThresholdEvicts(t *testing.T) {
	worker := workerNode()
	// After the reset (cleanups run last first): the worker's MemoryPressure gone, its taint with it, before
	// the next test schedules there.
	t.Cleanup(func() {
		poll.ForNil(t, 6*time.Minute, time.Second, worker+" without MemoryPressure", func() error {
			n, err := admin(t).CoreV1().Nodes().Get(context.Background(), worker, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeMemoryPressure && c.Status != corev1.ConditionFalse {
					return fmt.Errorf("MemoryPressure %s: %s", c.Status, c.Message)
				}
			}
			return nil
		})
	})
	resetAfter(t)
	const ns = "eviction"
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := admin(t)
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	grace := int64(1)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hungry"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace, RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector: map[string]string{corev1.LabelHostname: worker},
			Containers:   []corev1.Container{{Name: "app", Image: devcluster.ImageRepo + "/pause:" + devcluster.ImageTag}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
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
			if p.PodRef.Namespace == ns && p.PodRef.Name == "hungry" && p.Memory != nil && p.Memory.WorkingSetBytes != nil {
				return nil
			}
		}
		return fmt.Errorf("no memory stats of %s/hungry yet", ns)
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
	evicted := fmt.Sprintf("%s: %s/hungry may be rejected (Evicted) when the restarted kubelet admits it again "+
		"under MemoryPressure", worker, ns)
	out, err := kubectlDKC(ctx, "diff", worker, "--configmap", "kube-system/"+cm.Name, "--kubelet-check-dir",
		cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("kubectl dkc diff: %v\n%s", err, out)
	}
	for _, want := range []string{pressure, fmt.Sprintf("is below the new hard eviction threshold %dMi", threshold), evicted} {
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

	// What the prediction claims is what the kubelet does.
	assign(t, worker, cm)
	poll.ForNil(t, 4*time.Minute, time.Second, "the restarted kubelet to stop "+ns+"/hungry for MemoryPressure", func() error {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "hungry", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		raw, err := os.ReadFile(cluster.NodeLogDir(worker) + "/kubelet.log")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, `pod="`+ns+`/hungry"`) && strings.Contains(line, `reason="Evicted"`) {
				t.Logf("the kubelet: %s", line)
				return nil
			}
		}
		t.Fatalf("%s/hungry stopped (%s %s: %s), but the kubelet's log does not say it was for MemoryPressure", ns,
			p.Status.Phase, p.Status.Reason, p.Status.Message)
		return nil
	})
	sidecars, err := c.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=dkc-sidecar", FieldSelector: "spec.nodeName=" + worker})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range sidecars.Items {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("sidecar %s on %s: %s %s, want Running (critical pods are not evicted)", p.Name, worker,
				p.Status.Phase, p.Status.Reason)
		}
	}
}
