// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodedrain"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// TestAssignDrainToTheStaticCPUManager: the worker runs a Deployment's pod behind a PodDisruptionBudget
// that allows no disruption, under the CPU manager's none policy. The static policy (a CPU reserved) is
// what the kubelet refuses to start with on that checkpoint:
//   - assigned through the annotation, the node's sidecar refuses it before touching the kubelet, and says
//     the node must be drained first;
//   - kubectl dkc assign --drain cordons the node and retries the eviction the budget refuses, without
//     restarting the kubelet, until the budget is relaxed; the pod is then evicted and runs on the other
//     node; the sidecar removes cpu_manager_state with the kubelet stopped, the kubelet runs the static
//     policy (/configz and the new checkpoint say so), restarted once, and the node is uncordoned, Ready,
//     without dkc's marks;
//   - kubectl dkc reset --drain takes it back to the none policy the same way.
func TestAssignDrainToTheStaticCPUManager(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := admin(t)
	worker := workerNode()
	other := cluster.ControlPlaneNode()
	t.Cleanup(func() { undrain(t, worker) })

	const ns = "drain-cli"
	before := webBehindABudget(ctx, t, ns, worker)

	state := filepath.Join(rootDir(t, worker), "cpu_manager_state")
	if got := checkpointPolicy(t, state); got != "none" {
		t.Fatalf("%s says policy %q before the change, want none", state, got)
	}
	cm := createConfigData(t, "drain-static-cpus", withFields(t, nodeConfig(t, worker, 5),
		map[string]any{"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}))
	starts := kubeletStarts(t, worker)

	// Through the annotation, which no CLI checks: the sidecar refuses it and leaves the kubelet alone.
	refusedUndrained(t, worker, cm, "cpu_manager_state")

	// --drain: the budget holds the eviction back; nothing restarts meanwhile.
	relax := drainBlockedByBudget(ctx, t, worker, ns, cm)
	n, err := c.CoreV1().Nodes().Get(ctx, worker, metav1.GetOptions{})
	if err != nil || !n.Spec.Unschedulable || n.Annotations[nodedrain.CordonedAnnotation] != "kubectl-dkc" {
		t.Fatalf("%s while the drain waits: unschedulable %v, cordoned by %q (%v); want cordoned by kubectl-dkc",
			worker, n.Spec.Unschedulable, n.Annotations[nodedrain.CordonedAnnotation], err)
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, before.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("pod %s evicted though its budget allows no disruption (%v)", before.Name, err)
	}
	// Neither the refused assignment, nor going back to the config it runs, nor the drain so far restarted it.
	startsBeforeDrain := kubeletStarts(t, worker)
	if startsBeforeDrain != starts {
		t.Errorf("%s: the kubelet started %d times before the node was drained, want 0", worker, startsBeforeDrain-starts)
	}
	relax()

	after := webPod(t, ns, other, 3*time.Minute)
	if after.Name == before.Name {
		t.Errorf("pod %s still runs; want it evicted and replaced on %s", before.Name, other)
	}
	if got := configzField(t, worker, "cpuManagerPolicy"); got != `"static"` {
		t.Errorf("%s: /configz says cpuManagerPolicy %v, want static", worker, got)
	}
	waitCheckpoint(t, state, "static") // not removed and written again: still "none"
	if got := kubeletStarts(t, worker) - startsBeforeDrain; got != 1 {
		t.Errorf("%s: the kubelet started %d times for the change, want once", worker, got)
	}
	waitRunning(t, worker, cm, time.Minute)
	released(t, worker)

	// And back, the same way: the none policy refuses the static checkpoint as much.
	if out, err := kubectlDKC(ctx, "reset", worker, "--drain", "--drain-timeout", "3m", "--timeout", "4m"); err != nil {
		t.Fatalf("reset --drain: %v\n%s", err, out)
	}
	if got := configzField(t, worker, "cpuManagerPolicy"); got != `"none"` {
		t.Errorf("%s after reset --drain: /configz says cpuManagerPolicy %v, want none", worker, got)
	}
	waitCheckpoint(t, state, "none")
	released(t, worker)
}

// TestPoolDrainsForTheStaticCPUManager: the same change through a pool over the worker, which may drain
// (spec.disruption.drain Allowed). The node's sidecar refuses the revision for want of a drain, so the pool
// cordons the node (marked as its own) and drains it; the budget holds the eviction back, and nothing
// restarts meanwhile; relaxed, the pod moves to the other node, the pool marks the node drained, the
// sidecar removes cpu_manager_state with the kubelet stopped, the kubelet runs the static policy, and the
// pool uncordons the node once it runs the revision. (The control-plane node hosts dkc-server, whose
// replicas a drain of the only control-plane node would evict with nowhere to go: the pool selects the
// worker alone.)
func TestPoolDrainsForTheStaticCPUManager(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := admin(t)
	worker := workerNode()
	t.Cleanup(func() { undrain(t, worker) })
	const pool = "drain-pool"
	deletePoolAtEnd(t, pool) // runs before undrain: the pool would assign the node again
	before := webBehindABudget(ctx, t, "drain-pool", worker)

	state := filepath.Join(rootDir(t, worker), "cpu_manager_state")
	cm := createConfigData(t, "drain-pool-static-cpus", withFields(t, nodeConfig(t, worker, 5),
		map[string]any{"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}))
	starts := kubeletStarts(t, worker)
	drainingPool(ctx, t, pool, worker, cm)
	// The budget allows no disruption: the pod stays while the drain retries, the node in progress.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) { // proves a negative: sampled over the drain's retries (every 5s)
		if p, err := c.CoreV1().Pods("drain-pool").Get(ctx, before.Name, metav1.GetOptions{}); err != nil ||
			p.DeletionTimestamp != nil {
			t.Fatalf("pod %s evicted though its budget allows no disruption (%v)", before.Name, err)
		}
		time.Sleep(time.Second)
	}
	if p := getPool(t, pool); p.Status.Nodes.InProgress != 1 {
		t.Errorf("pool status while draining: %+v, want the node in progress", p.Status.Nodes)
	}
	if got := kubeletStarts(t, worker); got != starts {
		t.Errorf("%s: the kubelet started %d times before the node was drained, want 0", worker, got-starts)
	}
	relaxBudget(ctx, t, "drain-pool")

	released(t, worker)
	snap := snapshotCM(t, pool)
	if v := view(t, worker); srcName(v.status.Active) != name(snap) || v.status.Error != "" {
		t.Errorf("%s released while it does not run the revision: %s", worker, v)
	}
	after := webPod(t, "drain-pool", cluster.ControlPlaneNode(), 3*time.Minute)
	if after.Name == before.Name {
		t.Errorf("pod %s still runs; want it evicted and replaced on %s", before.Name, cluster.ControlPlaneNode())
	}
	if got := configzField(t, worker, "cpuManagerPolicy"); got != `"static"` {
		t.Errorf("%s: /configz says cpuManagerPolicy %v, want static", worker, got)
	}
	waitCheckpoint(t, state, "static")
	if got := kubeletStarts(t, worker) - starts; got != 1 {
		t.Errorf("%s: the kubelet started %d times for the revision, want once", worker, got)
	}
}

// webBehindABudget runs a Deployment's one pod in namespace ns, on worker while it may (it tolerates the
// control-plane node too), behind a PodDisruptionBudget that allows no disruption (patch maxUnavailable to
// let it go). It returns the pod once the budget counts it.
func webBehindABudget(ctx context.Context, t *testing.T, ns, worker string) corev1.Pod {
	t.Helper()
	schedulable(t, worker) // the pod only prefers worker: while it cannot go there, it goes elsewhere
	c := admin(t)
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	labels := map[string]string{"app": "web"}
	grace := int64(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{Name: "web",
						Image: devcluster.ImageRepo + "/pause:" + devcluster.ImageTag}},
					// It may move to the control-plane node, and prefers the worker while it can run there.
					Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane",
						Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100,
							Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
								Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{worker}}}}}}}},
				},
			},
		},
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := webPod(t, ns, worker, 3*time.Minute)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: new(intstr.FromInt32(0)),
			Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}
	if pdb, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	} else {
		// Until the disruption controller has counted the pod, the budget refuses nothing.
		poll.ForNil(t, time.Minute, 200*time.Millisecond, "the budget counts the pod", func() error {
			got, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Status.ObservedGeneration != got.Generation || got.Status.ExpectedPods != 1 {
				return fmt.Errorf("budget status %+v", got.Status)
			}
			return nil
		})
	}

	return before
}

// workerNode is the installed form's node without the control-plane role.
func workerNode() string {
	if nodes[0] == cluster.ControlPlaneNode() {
		return nodes[1]
	}
	return nodes[0]
}

// syncBuffer is a bytes.Buffer that a running command writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// runKubectlDKC runs kubectl dkc in the background: its output so far, and its error once it returns.
func runKubectlDKC(ctx context.Context, args ...string) (*syncBuffer, <-chan error) {
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		cmd := plugin.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: out, ErrOut: out})
		cmd.SetArgs(append([]string{"--kubeconfig=" + cluster.KubeconfigPath()}, args...))
		cmd.SetOut(out)
		cmd.SetErr(out)
		done <- cmd.ExecuteContext(ctx)
	}()
	return out, done
}

// webPod waits until the Deployment's one pod runs, ready, on node, and nothing else of it is left.
func webPod(t *testing.T, ns, node string, timeout time.Duration) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	poll.ForNil(t, timeout, 300*time.Millisecond, "web's one pod ready on "+node, func() error {
		list, err := admin(t).CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 || list.Items[0].Spec.NodeName != node || !ready(&list.Items[0]) ||
			list.Items[0].DeletionTimestamp != nil {
			var s []string
			for _, p := range list.Items {
				s = append(s, fmt.Sprintf("%s on %q ready=%v deleting=%v", p.Name, p.Spec.NodeName, ready(&p),
					p.DeletionTimestamp != nil))
			}
			return fmt.Errorf("pods: %v", s)
		}
		pod = list.Items[0]
		return nil
	})
	return pod
}

// rootDir is node's kubelet root directory as the host sees it.
func rootDir(t *testing.T, node string) string {
	t.Helper()
	for _, n := range cluster.State().Nodes {
		if n.Name == node {
			return n.RootDir
		}
	}
	t.Fatalf("no node %s", node)
	return ""
}

// waitCheckpoint waits for the CPU manager's checkpoint at path to name policy: a kubelet that starts
// without one writes it as its CPU manager starts, which /configz does not wait for.
func waitCheckpoint(t *testing.T, path, policy string) {
	t.Helper()
	poll.ForNil(t, time.Minute, 300*time.Millisecond, path+" written under the "+policy+" policy", func() error {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var c struct {
			PolicyName string `json:"policyName"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return fmt.Errorf("%w: %s", err, raw)
		}
		if c.PolicyName != policy {
			return fmt.Errorf("policy %q", c.PolicyName)
		}
		return nil
	})
}

// checkpointPolicy is the policy the CPU manager's checkpoint file names.
func checkpointPolicy(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("CPU manager checkpoint: %v", err)
	}
	var c struct {
		PolicyName string `json:"policyName"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("CPU manager checkpoint %s: %v", raw, err)
	}
	return c.PolicyName
}

// withFields is the kubelet config data with fields set.
func withFields(t *testing.T, data string, fields map[string]any) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(data), &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		m[k] = v
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// released checks that node is schedulable, Ready and without dkc's drain marks.
func released(t *testing.T, node string) {
	t.Helper()
	poll.ForNil(t, time.Minute, 300*time.Millisecond, node+" uncordoned, Ready, unmarked", func() error {
		n, err := admin(t).CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, cordoned := n.Annotations[nodedrain.CordonedAnnotation]
		_, drained := n.Annotations[nodeconfig.DrainedAnnotation]
		if n.Spec.Unschedulable || cordoned || drained || !nodeReady(n) {
			return fmt.Errorf("unschedulable %v, cordon mark %v, drain mark %v, ready %v", n.Spec.Unschedulable, cordoned,
				drained, nodeReady(n))
		}
		return nil
	})
}

// undrain puts node back as the other tests expect it: its local config under the none policy, whatever
// this test left.
func undrain(t *testing.T, node string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if configzField(t, node, "cpuManagerPolicy") != `"none"` || view(t, node).status.Assigned != nil {
		if out, err := kubectlDKC(ctx, "reset", node, "--drain", "--drain-timeout", "1m", "--timeout", "3m"); err != nil {
			t.Errorf("cleanup: reset --drain %s: %v\n%s", node, err, out)
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null}},"spec":{"unschedulable":false}}`,
		nodedrain.CordonedAnnotation, nodeconfig.DrainedAnnotation)
	if _, err := admin(t).CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", []byte(patch),
		metav1.PatchOptions{}); err != nil {
		t.Errorf("cleanup: uncordon %s: %v", node, err)
	}
	schedulable(t, node)
}

// schedulable waits until the scheduler would place pods on node again: Ready, uncordoned, and without the
// not-ready taint the node lifecycle controller sets while a restarted kubelet is not Ready yet (a test
// that starts a pod meant for node within that window would find it on the other node).
func schedulable(t *testing.T, node string) {
	t.Helper()
	poll.ForNil(t, 2*time.Minute, 300*time.Millisecond, node+" schedulable", func() error {
		n, err := admin(t).CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Spec.Unschedulable || !nodeReady(n) {
			return fmt.Errorf("unschedulable %v, ready %v", n.Spec.Unschedulable, nodeReady(n))
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == corev1.TaintNodeNotReady || taint.Key == corev1.TaintNodeUnreachable {
				return fmt.Errorf("taint %s", taint.Key)
			}
		}
		return nil
	})
}

// refusedUndrained assigns node cm through its annotation, which no CLI checks, and waits until the node's
// sidecar refuses it for want of a drain (DrainRequired, ConfigOK False and naming each of want) without
// restarting the kubelet; then it assigns the node its local config again and waits until it runs it.
func refusedUndrained(t *testing.T, node string, cm *corev1.ConfigMap, want ...string) {
	t.Helper()
	starts := kubeletStarts(t, node)
	assign(t, node, cm)
	var msg string
	poll.ForNil(t, 2*time.Minute, 300*time.Millisecond, node+" refuses the change for want of a drain", func() error {
		v := view(t, node)
		if srcName(v.status.Assigned) != name(cm) || v.status.Error != string(nodeconfig.DrainRequiredError) ||
			srcName(v.status.Active) != "local" || v.configOK == nil || v.configOK.Status != corev1.ConditionFalse {
			return errors.New(v.String())
		}
		for _, w := range want {
			if !strings.Contains(v.configOK.Message, w) {
				t.Fatalf("ConfigOK %q lacks %q", v.configOK.Message, w)
			}
		}
		msg = v.configOK.Message
		return nil
	})
	t.Logf("ConfigOK: %s", msg)
	if got := kubeletStarts(t, node); got != starts {
		t.Errorf("%s: the kubelet started %d times while the sidecar refused the change, want 0", node, got-starts)
	}
	assign(t, node, nil)
	waitRunning(t, node, nil, 2*time.Minute)
}

// stillRunning fails the test unless pod ns/name runs, not being deleted.
func stillRunning(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	if p, err := admin(t).CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil ||
		p.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod %s/%s stopped while nothing may evict it (%v)", ns, name, err)
	}
}

// relaxBudget lets webBehindABudget's budget in ns allow one disruption.
func relaxBudget(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	if _, err := admin(t).PolicyV1().PodDisruptionBudgets(ns).Patch(ctx, "web", "application/merge-patch+json",
		[]byte(`{"spec":{"maxUnavailable":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// drainBlockedByBudget starts kubectl dkc assign --drain of node onto cm and waits until its drain retries
// the eviction webBehindABudget's budget refuses; wait relaxes the budget in ns and returns once the
// command succeeded.
func drainBlockedByBudget(ctx context.Context, t *testing.T, node, ns string, cm *corev1.ConfigMap) (wait func()) {
	t.Helper()
	out, done := runKubectlDKC(ctx, "assign", node, "--configmap", "kube-system/"+cm.Name, "--drain",
		"--drain-timeout", "5m", "--timeout", "4m", "--kubelet-check-dir", cluster.KubeletCheckDir())
	poll.ForNil(t, 2*time.Minute, 300*time.Millisecond, "the drain retries the eviction the budget refuses", func() error {
		if s := out.String(); !strings.Contains(s, "disruption budget") {
			return fmt.Errorf("output so far:\n%s", s)
		}
		return nil
	})
	return func() {
		t.Helper()
		relaxBudget(ctx, t, ns)
		var err error
		select {
		case err = <-done:
		case <-ctx.Done():
			t.Fatalf("assign --drain did not return:\n%s", out.String())
		}
		if err != nil {
			t.Fatalf("assign --drain: %v\n%s", err, out.String())
		}
		t.Logf("assign --drain:\n%s", out.String())
	}
}

// drainingPool creates pool over node alone, onto cm, which may drain, and waits until it cordons the node.
func drainingPool(ctx context.Context, t *testing.T, pool, node string, cm *corev1.ConfigMap) {
	t.Helper()
	spec := fmt.Sprintf(`apiVersion: dkc.dev/v1alpha1
kind: KubeletConfigPool
metadata: {name: %s}
spec:
  nodeSelector: {matchLabels: {kubernetes.io/hostname: %s}}
  configMap: {namespace: kube-system, name: %s, kubeletConfigKey: kubelet}
  disruption: {drain: Allowed, drainTimeout: 5m}
`, pool, node, cm.Name)
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(spec), &obj); err != nil {
		t.Fatal(err)
	}
	if _, err := pools(t).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.ForNil(t, 3*time.Minute, 300*time.Millisecond, "the pool cordons "+node+" and waits on the budget", func() error {
		n, err := admin(t).CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !n.Spec.Unschedulable || n.Annotations[nodedrain.CordonedAnnotation] != "pool/"+pool {
			return fmt.Errorf("unschedulable %v, cordoned by %q; %s", n.Spec.Unschedulable,
				n.Annotations[nodedrain.CordonedAnnotation], view(t, node))
		}
		return nil
	})
}

// livePods counts the pods bound to node that the kubelet admits again when it restarts: those not finished.
func livePods(ctx context.Context, t *testing.T, node string) int {
	t.Helper()
	pods, err := admin(t).CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live++
		}
	}
	return live
}
