// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

func pools(t *testing.T) dynamic.ResourceInterface {
	t.Helper()
	p, err := cluster.Pools()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func getPool(t *testing.T, name string) *v1alpha1.KubeletConfigPool {
	t.Helper()
	p, err := cluster.KubeletConfigPool(ctxFor(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// deletePoolAtEnd deletes the pool when t ends, before resetAfter's reset (register it after): the pool
// would otherwise assign the nodes again. Its assignment records and revisions go too.
func deletePoolAtEnd(t *testing.T, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = pools(t).Delete(ctx, name, metav1.DeleteOptions{})
		_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			_, err := pools(t).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		for _, n := range nodes {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, v1alpha1.AnnotationAssignment)
			_, _ = admin(t).CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		}
		t.Cleanup(func() { // after the reset: the nodes no longer use the revisions
			_ = admin(t).CoreV1().ConfigMaps("kube-system").DeleteCollection(context.Background(), metav1.DeleteOptions{},
				metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + name})
		})
	})
}

// klogStart matches the kubelet's start line and its klog header time ("I1127 00:44:21.919892").
var klogStart = regexp.MustCompile(`(?m)^[IWE](\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) .*"Kubelet version"`)

// kubeletStartTimes are the times node's kubelet started, from its log (the node's clock is the host's).
func kubeletStartTimes(t *testing.T, node string) []time.Time {
	t.Helper()
	raw, err := os.ReadFile(cluster.NodeLogDir(node) + "/kubelet.log")
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	year := time.Now().UTC().Year()
	for _, m := range klogStart.FindAllStringSubmatch(string(raw), -1) {
		at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.UTC)
		if err != nil {
			t.Fatalf("kubelet start time %q: %v", m[1], err)
		}
		out = append(out, at.AddDate(year, 0, 0))
	}
	return out
}

// startsSince are node's kubelet starts after since.
func startsSince(t *testing.T, node string, since time.Time) []time.Time {
	t.Helper()
	var out []time.Time
	for _, at := range kubeletStartTimes(t, node) {
		if at.After(since) {
			out = append(out, at)
		}
	}
	return out
}

// oneAtATime checks that each node's kubelet started once since since, and the two starts at least a trial
// apart: with maxUnavailable 1, the second node is assigned only once the first has proven the config.
func oneAtATime(t *testing.T, since time.Time) {
	t.Helper()
	var starts []time.Time
	for _, n := range nodes {
		s := startsSince(t, n, since)
		if len(s) != 1 {
			t.Errorf("%s: kubelet started %d times (%v), want once", n, len(s), s)
			return
		}
		starts = append(starts, s[0])
	}
	gap := starts[1].Sub(starts[0]).Abs()
	if gap < devclustertest.TrialDuration {
		t.Errorf("kubelet starts %v apart (%v): two nodes in progress at once under maxUnavailable 1 (the trial is %v)", gap, starts, devclustertest.TrialDuration)
	}
	t.Logf("kubelet starts %v apart", gap.Round(time.Millisecond))
}

// leader is the dkc-server pod that holds the pool controller's Lease.
func leader(t *testing.T) string {
	t.Helper()
	l, err := admin(t).CoordinationV1().Leases("kube-system").Get(ctxFor(t), "dkc-server-pools", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		t.Fatalf("the pool controller's Lease has no holder: %v", err)
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod
}

// snapshotCM is the pool's current revision snapshot, the ConfigMap its nodes run.
func snapshotCM(t *testing.T, pool string) *corev1.ConfigMap {
	t.Helper()
	p := getPool(t, pool)
	cm, err := admin(t).CoreV1().ConfigMaps("kube-system").Get(ctxFor(t), v1alpha1.SnapshotName(pool, p.Status.CurrentRevision), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

func editConfig(t *testing.T, cm *corev1.ConfigMap, data string) {
	t.Helper()
	cm, err := admin(t).CoreV1().ConfigMaps("kube-system").Get(ctxFor(t), cm.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["kubelet"] = data
	if _, err := admin(t).CoreV1().ConfigMaps("kube-system").Update(ctxFor(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestPoolOnRealNodes drives a KubeletConfigPool over the installed form's two real nodes with
// `kubectl dkc rollout`, as an operator would, one node at a time:
//   - a rollout completes though the dkc-server replica leading the pool controller is deleted when the
//     first node is assigned: the other replica takes over and finishes it; each kubelet starts once, the
//     two starts at least a trial apart (never two kubelets restarting at once);
//   - an in-place edit to a config the kubelet's validation refuses stops before any node is touched
//     (ConfigInvalid: dkc-server checks it with the code of each node's kubelet minor), and so does one
//     the kubelet refuses on its CPU manager's checkpointed state (DrainRequired: dkc does not drain);
//   - an in-place edit to a config that validates but keeps the kubelet from starting fails the first node
//     (rolled back to last-known-good) and halts the pool before the second is touched;
//   - undo puts the pool back on the good revision, on both nodes;
//   - paused, an edit assigns nothing; resumed, it rolls out one node at a time, though both dkc-server
//     replicas are replaced meanwhile (kubectl rollout restart, as an upgrade does).
func TestPoolOnRealNodes(t *testing.T) {
	resetAfter(t)
	const pool = "installed-pool"
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cm := createConfig(t, "installed-pool", "node-1", 43)

	// 1. The rollout, and the leader deleted mid-way.
	since := time.Now()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/installed-pool", "-l", "kubernetes.io/os=linux", "--max-unavailable", "1", "--timeout", "5m")
		done <- result{out, err}
	}()
	poll.For(t, time.Minute, 200*time.Millisecond, "the pool to assign a node", func() bool {
		u, err := pools(t).Get(ctx, pool, metav1.GetOptions{})
		if err != nil {
			return false
		}
		n, _, _ := unstructured.NestedInt64(u.Object, "status", "nodes", "inProgress")
		return n > 0
	})
	old := leader(t)
	if err := admin(t).CoreV1().Pods("kube-system").Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the leader %s: %v", old, err)
	}
	t.Logf("deleted the leading replica %s with the first node in progress", old)
	r := <-done
	if r.err != nil || !strings.Contains(r.out, "rollout complete: 2 nodes run revision") {
		t.Fatalf("kubectl dkc rollout: %v\n%s", r.err, r.out)
	}
	if now := leader(t); now == old {
		t.Errorf("the deleted replica %s still leads", old)
	}
	good := snapshotCM(t, pool)
	for _, n := range nodes {
		waitRunning(t, n, good, time.Minute)
	}
	nodeCannotDropItsAssignment(t, "node-1")
	oneAtATime(t, since)
	waitRolledOut(t, "deployment/dkc-server")

	// 2. A config the kubelet's validation refuses, edited in place: dkc-server checks it with the code of
	// both nodes' kubelet minors (1.34 and 1.37 here) and stops before any node is touched.
	since = time.Now()
	var refused map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, "node-1", 43)), &refused); err != nil {
		t.Fatal(err)
	}
	refused["eventRecordQPS"] = -1
	raw, err := yaml.Marshal(refused)
	if err != nil {
		t.Fatal(err)
	}
	editConfig(t, cm, string(raw))
	out, err := kubectlDKC(ctx, "rollout", pool, "--timeout", "1m")
	var stopped *plugin.ErrRolloutStopped
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonValidationFailed ||
		!strings.Contains(stopped.Message, "before any node is touched") || !strings.Contains(stopped.Message, "eventRecordQPS") {
		t.Fatalf("rollout of a config the kubelet's validation refuses: %v, want ConfigInvalid %s before any node\n%s", err, v1alpha1.ReasonValidationFailed, out)
	}
	t.Logf("refused before any node: %s", stopped.Message)
	for _, n := range nodes {
		if s := startsSince(t, n, since); len(s) != 0 {
			t.Errorf("%s: kubelet started %v for a config dkc-server refused", n, s)
		}
		waitRunning(t, n, good, 10*time.Second)
	}

	// 2b. A change the kubelet refuses on the state its CPU manager checkpointed under the running revision
	// (the static policy, on nodes whose checkpoint says none) needs a drain, which dkc does not do:
	// refused before any node is touched, naming each node and the state file.
	since = time.Now()
	var pinned map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, "node-1", 43)), &pinned); err != nil {
		t.Fatal(err)
	}
	pinned["cpuManagerPolicy"], pinned["reservedSystemCPUs"] = "static", "0"
	if raw, err = yaml.Marshal(pinned); err != nil {
		t.Fatal(err)
	}
	editConfig(t, cm, string(raw))
	out, err = kubectlDKC(ctx, "rollout", pool, "--timeout", "1m")
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonDrainRequired {
		t.Fatalf("rollout of a change that needs a drain: %v, want ConfigInvalid %s before any node\n%s", err, v1alpha1.ReasonDrainRequired, out)
	}
	for _, n := range nodes {
		if want := "node " + n + " (revision "; !strings.Contains(stopped.Message, want) ||
			!strings.Contains(stopped.Message, "cpu_manager_state (cpuManagerPolicy: none → static)") {
			t.Errorf("DrainRequired %q does not name %s and cpu_manager_state (cpuManagerPolicy: none → static)", stopped.Message, n)
		}
	}
	t.Logf("refused before any node: %s", stopped.Message)
	for _, n := range nodes {
		if s := startsSince(t, n, since); len(s) != 0 {
			t.Errorf("%s: kubelet started %v for a change dkc-server refused", n, s)
		}
		waitRunning(t, n, good, 10*time.Second)
	}

	// 3. A config that fails at runtime, edited in place: the first node rolls back, the pool halts.
	since = time.Now()
	var broken map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, "node-1", 43)), &broken); err != nil {
		t.Fatal(err)
	}
	broken["containerRuntimeEndpoint"] = "unix:///run/dkc-no-such-runtime.sock"
	if raw, err = yaml.Marshal(broken); err != nil {
		t.Fatal(err)
	}
	editConfig(t, cm, string(raw))
	out, err = kubectlDKC(ctx, "rollout", pool, "--timeout", "4m")
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonFailureBudgetExhausted {
		t.Fatalf("rollout of a config that fails at runtime: %v, want the pool halted\n%s", err, out)
	}
	p := getPool(t, pool)
	if len(p.Status.FailedNodes) != 1 || p.Status.FailedNodes[0].Reason != v1alpha1.FailureRolledBack {
		t.Fatalf("failed nodes %+v, want one RolledBack", p.Status.FailedNodes)
	}
	failed := p.Status.FailedNodes[0].Name
	for _, n := range nodes {
		if n == failed {
			continue
		}
		if s := startsSince(t, n, since); len(s) != 0 {
			t.Errorf("%s: kubelet started %v after the halt's first node: touched", n, s)
		}
		waitRunning(t, n, good, 10*time.Second)
	}
	t.Logf("halted: %s %s", failed, p.Status.FailedNodes[0].Error)

	// 4. undo.
	if out, err := kubectlDKC(ctx, "rollout", "undo", pool, "--timeout", "3m"); err != nil || !strings.Contains(out, "rollout complete") {
		t.Fatalf("undo: %v\n%s", err, out)
	}
	for _, n := range nodes {
		waitRunning(t, n, good, time.Minute)
	}
	if p := getPool(t, pool); meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHalted) {
		t.Errorf("still halted after undo: %+v", p.Status.Conditions)
	}

	// 5. Paused, an edit (back to the operator's ConfigMap, fixed) assigns nothing; resumed, it rolls out.
	if out, err := kubectlDKC(ctx, "rollout", "pause", pool); err != nil {
		t.Fatalf("pause: %v\n%s", err, out)
	}
	since = time.Now()
	editConfig(t, cm, nodeConfig(t, "node-1", 44))
	if out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/installed-pool", "--timeout", "1m"); err != nil || !strings.Contains(out, "paused") {
		t.Fatalf("rollout while paused: %v\n%s", err, out)
	}
	time.Sleep(5 * time.Second) // proves a negative: the paused pool restarts no kubelet meanwhile
	for _, n := range nodes {
		if s := startsSince(t, n, since); len(s) != 0 {
			t.Errorf("%s: kubelet started %v while the pool was paused", n, s)
		}
	}
	if out, err := kubectlDKC(ctx, "rollout", "resume", pool); err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	// And both replicas replaced under it, the way a dkc upgrade does.
	if out, err := kubectl(t, "-n", "kube-system", "rollout", "restart", "deployment/dkc-server"); err != nil {
		t.Fatalf("rollout restart: %v\n%s", err, out)
	}
	if out, err := kubectlDKC(ctx, "rollout", "status", pool, "--timeout", "3m"); err != nil || !strings.Contains(out, "rollout complete") {
		t.Fatalf("rollout status after resume: %v\n%s", err, out)
	}
	next := snapshotCM(t, pool)
	for _, n := range nodes {
		waitRunning(t, n, next, time.Minute)
		if got := configzQPS(t, n); got != 44 {
			t.Errorf("%s: configz eventRecordQPS %v, want 44", n, got)
		}
	}
	oneAtATime(t, since)
	waitRolledOut(t, "deployment/dkc-server")
}

// applyPool applies, with kubectl as a user would, the KubeletConfigPool pool over every Linux node with
// kube-system/<pool> as its ConfigMap and rest (YAML lines of spec, two-space indented) added to its spec.
func applyPool(t *testing.T, pool, rest string) {
	t.Helper()
	manifest := fmt.Sprintf(`apiVersion: dkc.dev/v1alpha1
kind: KubeletConfigPool
metadata:
  name: %s
spec:
  nodeSelector: {matchLabels: {kubernetes.io/os: linux}}
  configMap: {namespace: kube-system, name: %s, kubeletConfigKey: kubelet}
%s`, pool, pool, rest)
	file := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply the pool: %v\n%s\n%s", err, out, manifest)
	}
}
