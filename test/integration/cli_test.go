// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
)

// kubectlDKC runs `kubectl dkc args...` in process against the test cluster.
func kubectlDKC(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(append([]string{"--kubeconfig=" + cluster.KubeconfigPath()}, args...))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func TestKubectlDKCAssignStatusDumpDiffReset(t *testing.T) {
	const node = "sim-2"
	t.Cleanup(func() { _, _, _ = kubectlDKC(t, "reset", node) })
	createConfigMap(t, "cli-config", map[string]string{"kubelet": simConfigFor(t, node, "eventRecordQPS: 23\n")})
	name := "cli-config@" + mustRV(t, "cli-config")

	out, _, err := kubectlDKC(t, "assign", node, "--configmap", "kube-system/cli-config")
	if err != nil || !strings.Contains(out, "node/sim-2 assigned kube-system/cli-config (key kubelet) via annotation dkc.dev/config-source") {
		t.Fatalf("assign: %v\n%s", err, out)
	}
	waitNodeStatus(t, node, name, name, "*", "", time.Minute)

	out, _, err = kubectlDKC(t, "status", node)
	if err != nil || !strings.Contains(out, "ASSIGNED") || !strings.Contains(out, "kube-system/"+name) || !strings.Contains(out, "True") {
		t.Errorf("status table: %v\n%s", err, out)
	}
	out, _, err = kubectlDKC(t, "status", "-o", "json", node)
	var rows []plugin.NodeStatus
	if err != nil || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0].Status.Active == nil || rows[0].ConfigOK != "True" {
		t.Errorf("status -o json: %v\n%s", err, out)
	}
	if out, _, err = kubectlDKC(t, "status", "-o", "yaml", node); err != nil || !strings.Contains(out, "node: sim-2") {
		t.Errorf("status -o yaml: %v\n%s", err, out)
	}

	// dump (on the real node: the apiserver proxies configz to real kubelets only): the running config as
	// a KubeletConfiguration that loads back as it runs.
	resetRealNode(t)
	out, _, err = kubectlDKC(t, "dump", realNode)
	if err != nil || !strings.Contains(out, "kind: KubeletConfiguration") || !strings.Contains(out, "enforceNodeAllocatable: []") {
		t.Fatalf("dump: %v\n%s", err, out)
	}
	file := filepath.Join(t.TempDir(), "dumped.yaml")
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := kubeletcheck.Load(context.Background(), file, nil); err != nil || len(r.Config.EnforceNodeAllocatable) != 0 {
		t.Errorf("dumped config does not load back as running: %v", err)
	}

	// diff: the dump itself changes nothing; another config shows each field with its safety.
	createConfigMap(t, "cli-dumped", map[string]string{"kubelet": out})
	if out, _, err = kubectlDKC(t, "diff", realNode, "--configmap", "kube-system/cli-dumped", "--kubelet-check-dir", cluster.KubeletCheckDir()); err != nil || !strings.Contains(out, "no changes") {
		t.Errorf("diff against the dumped running config: %v\n%s", err, out)
	}
	createConfigMap(t, "cli-next", map[string]string{"kubelet": kubeletConfig(t, "eventRecordQPS: 24\ncpuManagerPolicy: static\nmaxPods: 50\n")})
	out, _, err = kubectlDKC(t, "diff", realNode, "--configmap", "kube-system/cli-next", "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("diff: %v\n%s", err, out)
	}
	for _, want := range []string{"eventRecordQPS", "restart-safe", "cpuManagerPolicy", "needs-state-reset-and-drain", "maxPods", "disruptive",
		"drain node " + realNode + " and remove cpu_manager_state (cpuManagerPolicy: none → static) first"} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	if out, _, err = kubectlDKC(t, "diff", realNode, "--configmap", "kube-system/cli-next", "-o", "json", "--kubelet-check-dir", cluster.KubeletCheckDir()); err != nil || !strings.Contains(out, `"safety": "needs-state-reset-and-drain"`) {
		t.Errorf("diff -o json: %v\n%s", err, out)
	}

	// A change the kubelet refuses to start with on its CPU manager's checkpointed state is refused before
	// any node is assigned, naming the state file; --drained (the node drained, the file removed) is the
	// way past it. The real node runs its local config (cpuManagerPolicy none) here.
	createConfigMap(t, "cli-static-cpus", map[string]string{"kubelet": kubeletConfig(t, "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n")})
	_, _, err = kubectlDKC(t, "assign", realNode, "--configmap", "kube-system/cli-static-cpus", "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err == nil || !strings.Contains(err.Error(), "cpu_manager_state (cpuManagerPolicy: none → static)") || !strings.Contains(err.Error(), "--drain") {
		t.Errorf("assign of another CPU manager policy: %v; want it refused, naming cpu_manager_state and --drain", err)
	}
	if n, err := adminClient(t).CoreV1().Nodes().Get(context.Background(), realNode, metav1.GetOptions{}); err != nil || n.Annotations[nodeconfig.SourceAnnotation] != "" {
		t.Errorf("the refused assign wrote node %s's source: %v %q", realNode, err, n.Annotations[nodeconfig.SourceAnnotation])
	}

	// Refusals with the apiserver's messages, before anything is written.
	if _, _, err := kubectlDKC(t, "assign", node, "--configmap", "kube-system/cli-config", "--key", "../x"); err == nil ||
		!strings.Contains(err.Error(), "spec.configSource.configMap.kubeletConfigKey: Invalid value") {
		t.Errorf("bad key accepted: %v", err)
	}
	if _, _, err := kubectlDKC(t, "assign", node, "--configmap", "kube-system/no-such"); err == nil {
		t.Error("assign of a missing ConfigMap accepted")
	}

	if out, _, err = kubectlDKC(t, "reset", node); err != nil || !strings.Contains(out, "reset") {
		t.Fatalf("reset: %v\n%s", err, out)
	}
	waitNodeStatus(t, node, "local", "local", "local", "", time.Minute)
}

// simConfigFor is a valid config for a simulated node: its local config (its ports) plus extra fields.
func simConfigFor(t *testing.T, node, extra string) string {
	t.Helper()
	local, err := os.ReadFile(cluster.KubeletConfigPath(node))
	if err != nil {
		t.Fatal(err)
	}
	return string(local) + extra
}

// snapshotOf is "name@resourceVersion" of the pool's revision snapshot, as a node's status names it.
func snapshotOf(t *testing.T, pool, rev string) string {
	t.Helper()
	name := v1alpha1.SnapshotName(pool, rev)
	return name + "@" + mustRV(t, name)
}

// TestKubectlDKCRolloutDrivesAPool is the operator's workflow on three simulated nodes, every step through
// `kubectl dkc rollout`, which writes a KubeletConfigPool and follows dkc-server rolling it out: a good
// config to every node; an in-place edit to a config the kubelet's validation refuses, which stops before
// any node is touched (ConfigInvalid, from dkc-server's check with the nodes' kubelet minor); an in-place
// edit to a config that validates but keeps the kubelet from starting, one node at a time, which halts at
// the first node with the node and its error named and the others untouched; retry, which goes on to the
// next node and halts again; undo, back to the good revision on every node; pause, under which a new
// config assigns nothing, and resume, which rolls it out; and history.
func TestKubectlDKCRolloutDrivesAPool(t *testing.T) {
	const pool = "cli-pool"
	usePool(t, pool)
	cm := createConfigMap(t, "cli-rollout", map[string]string{"kubelet": poolHeader + "eventRecordQPS: 33\n"})

	out, errOut, err := kubectlDKC(t, "rollout", pool, "--configmap", "kube-system/cli-rollout", "-l", poolSelector, "--max-unavailable", "100%", "--timeout", "2m")
	if err != nil || !strings.Contains(out, "kubeletconfigpool/"+pool+" created") || !strings.Contains(out, "rollout complete: 3 nodes run revision") {
		t.Fatalf("rollout of a good config: %v\n%s\n%s", err, out, errOut)
	}
	good := getPool(t, pool).Status.CurrentRevision
	g := snapshotOf(t, pool, good)
	for _, s := range poolSims() {
		waitNodeStatus(t, s, g, g, g, "", 10*time.Second)
	}

	// One node at a time from now on; then the edit, followed by `rollout POOL` with no flags (it waits for
	// the ConfigMap's new revision, not the one the pool had).
	if out, errOut, err := kubectlDKC(t, "rollout", pool, "--max-unavailable", "1", "--wait=false"); err != nil {
		t.Fatalf("rollout --max-unavailable 1: %v\n%s\n%s", err, out, errOut)
	}
	cm.Data["kubelet"] = poolHeader + "eventRecordQPS: -3\n"
	if cm, err = adminClient(t).CoreV1().ConfigMaps("kube-system").Update(testContext(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = kubectlDKC(t, "rollout", pool, "--timeout", "1m")
	var stopped *plugin.ErrRolloutStopped
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonValidationFailed {
		t.Fatalf("rollout of a config the kubelet's validation refuses: err %v, want ConfigInvalid %s\n%s\n%s", err, v1alpha1.ReasonValidationFailed, out, errOut)
	}
	bad := v1alpha1.RevisionName("kube-system", "kubelet", cm.Data)
	for _, want := range []string{"(revision " + bad + ")", "the kubelet " + simMinor(t) + " refuses it", "3 selected nodes run it", "eventRecordQPS", "before any node is touched"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, errOut)
		}
	}
	if assigned, _ := simsOn(t, v1alpha1.SnapshotName(pool, bad)); len(assigned) != 0 {
		t.Errorf("nodes assigned a revision the kubelet's validation refuses: %v", assigned)
	}
	for _, s := range poolSims() {
		waitNodeStatus(t, s, g, g, g, "", 5*time.Second) // untouched
	}

	// Fixed forward in place, to a config that validates but that the nodes' kubelets do not start with:
	// the rollout must not stop on the refusal of the content before.
	cm.Data["kubelet"] = poolHeader + noKubeletStarts
	if _, err := adminClient(t).CoreV1().ConfigMaps("kube-system").Update(testContext(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = kubectlDKC(t, "rollout", pool, "--timeout", "2m")
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonFailureBudgetExhausted {
		t.Fatalf("rollout of a config no kubelet starts with: err %v, want the pool halted\n%s\n%s", err, out, errOut)
	}
	p := getPool(t, pool)
	if len(p.Status.FailedNodes) != 1 {
		t.Fatalf("failed nodes %+v, want one", p.Status.FailedNodes)
	}
	first := p.Status.FailedNodes[0].Name
	for _, want := range []string{"node " + first + " failed revision " + p.Status.CurrentRevision, string(nodeconfig.HealthError),
		"kubectl dkc rollout undo " + pool, "kubectl dkc rollout retry " + pool} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the halt does not say %q:\n%s", want, errOut)
		}
	}
	for _, s := range poolSims() {
		if s != first {
			waitNodeStatus(t, s, g, g, g, "", 5*time.Second) // untouched
		}
	}
	out, _, _ = kubectlDKC(t, "rollout", "status", pool, "--wait=false")
	for _, want := range []string{"FAILED NODE", first, "Halted", v1alpha1.ReasonFailureBudgetExhausted, "previous: " + good} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout status lacks %q:\n%s", want, out)
		}
	}

	// retry: the first failure stops counting; the next node fails, and the pool halts again.
	out, errOut, err = kubectlDKC(t, "rollout", "retry", pool, "--timeout", "2m")
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonFailureBudgetExhausted || !strings.Contains(out, "retried (retry 1)") {
		t.Fatalf("retry: err %v, want the pool halted again\n%s\n%s", err, out, errOut)
	}
	if p = getPool(t, pool); len(p.Status.FailedNodes) != 2 {
		t.Errorf("failed nodes after a retry %+v, want two", p.Status.FailedNodes)
	}

	// undo: back to the good revision, everywhere.
	out, errOut, err = kubectlDKC(t, "rollout", "undo", pool, "--timeout", "2m")
	if err != nil || !strings.Contains(out, "rolled back to revision "+good) || !strings.Contains(out, "rollout complete") {
		t.Fatalf("undo: %v\n%s\n%s", err, out, errOut)
	}
	if p = getPool(t, pool); p.Status.CurrentRevision != good || condition(p, v1alpha1.ConditionHalted).Status == metav1.ConditionTrue {
		t.Errorf("after undo: revision %s (want %s), conditions %+v", p.Status.CurrentRevision, good, p.Status.Conditions)
	}
	for _, s := range poolSims() {
		waitNodeStatus(t, s, g, g, g, "", 30*time.Second)
	}

	// pause: a new config assigns nothing; resume rolls it out.
	if out, errOut, err := kubectlDKC(t, "rollout", "pause", pool); err != nil || !strings.Contains(out, "paused") {
		t.Fatalf("pause: %v\n%s\n%s", err, out, errOut)
	}
	createConfigMap(t, "cli-rollout-next", map[string]string{"kubelet": poolHeader + "eventRecordQPS: 34\n"})
	out, errOut, err = kubectlDKC(t, "rollout", pool, "--configmap", "kube-system/cli-rollout-next", "--max-unavailable", "100%", "--timeout", "1m")
	if err != nil || !strings.Contains(out, "paused") {
		t.Fatalf("rollout while paused: %v, want it to return saying so\n%s\n%s", err, out, errOut)
	}
	time.Sleep(3 * time.Second) // proves a negative: the paused pool assigns nothing meanwhile
	next := getPool(t, pool).Status.CurrentRevision
	if assigned, _ := simsOn(t, v1alpha1.SnapshotName(pool, next)); len(assigned) != 0 {
		t.Errorf("a paused pool assigned %v", assigned)
	}
	if out, errOut, err := kubectlDKC(t, "rollout", "resume", pool); err != nil || !strings.Contains(out, "resumed") {
		t.Fatalf("resume: %v\n%s\n%s", err, out, errOut)
	}
	if out, errOut, err := kubectlDKC(t, "rollout", "status", pool, "--timeout", "2m"); err != nil || !strings.Contains(out, "rollout complete: 3 nodes run revision "+next) {
		t.Fatalf("rollout status after resume: %v\n%s\n%s", err, out, errOut)
	}

	// history looks only where the pool's snapshots live, and marks one the pool did not record. Two objects
	// shaped as the pool's snapshots, whose data hash to their revision: in another namespace (not listed),
	// and in the pool's, unrecorded (listed REFUSED, with why).
	forged := map[string]string{"kubelet": poolHeader + "eventRecordQPS: 35\n"}
	client := adminClient(t)
	for _, ns := range []string{"default", "kube-system"} {
		rev := v1alpha1.RevisionName(ns, "kubelet", forged)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.SnapshotName(pool, rev),
			Labels: map[string]string{v1alpha1.LabelPool: pool, v1alpha1.LabelRevision: rev}}, Data: forged}
		if _, err := client.CoreV1().ConfigMaps(ns).Create(testContext(t), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().ConfigMaps(ns).Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
		})
	}
	elsewhere := v1alpha1.RevisionName("default", "kubelet", forged)
	unrecorded := v1alpha1.RevisionName("kube-system", "kubelet", forged)
	out, errOut, err = kubectlDKC(t, "rollout", "history", pool)
	if err != nil || !strings.Contains(out, next+"  ") || !strings.Contains(out, "current") || !strings.Contains(out, good) {
		t.Errorf("history: %v\n%s", err, out)
	}
	if strings.Contains(out, elsewhere) {
		t.Errorf("history lists a snapshot-shaped ConfigMap in namespace default, where the pool has none:\n%s", out)
	}
	if !regexp.MustCompile(unrecorded+`\s.*REFUSED`).MatchString(out) || !strings.Contains(errOut, "the pool records no snapshot of that revision") {
		t.Errorf("history does not refuse the unrecorded %s:\n%s\n%s", unrecorded, out, errOut)
	}
	if _, _, err := kubectlDKC(t, "rollout", "undo", pool, "--to-revision", unrecorded, "--wait=false"); err == nil ||
		!strings.Contains(err.Error(), "the pool records no snapshot of that revision") {
		t.Errorf("undo to the unrecorded %s: %v, want it refused", unrecorded, err)
	}
}

// TestKubectlDKCCheckBeforeAKubeletUpgrade: `kubectl dkc check --kubelet-version X.Y` loads every pool's and
// node's config with the code of kubelet X.Y. A pool's revision that sets a feature gate removed after 1.35
// (MemoryManager, GA in 1.32) is refused by 1.36 with the kubelet's own error, and passes 1.34; the real
// node's running config passes its own kubelet's minor.
func TestKubectlDKCCheckBeforeAKubeletUpgrade(t *testing.T) {
	const pool = "check-gated"
	createConfigMap(t, pool, map[string]string{"kubelet": poolHeader + "featureGates:\n  MemoryManager: true\n"})
	usePoolOn(t, pool, nil)
	// A pool that selects no node: its revision exists, and no kubelet is touched.
	kubectl(t, strings.Replace(poolManifest(pool, pool, "1"), poolLabel+`: "true"`, poolLabel+`: "none"`, 1), "apply", "-f", "-")
	p := waitPool(t, pool, time.Minute, nil, func(p *v1alpha1.KubeletConfigPool) bool { return p.Status.CurrentRevision != "" })
	row := "configmap kube-system/" + v1alpha1.SnapshotName(pool, p.Status.CurrentRevision) + " key kubelet (current revision " +
		p.Status.CurrentRevision + ")"

	check := func(minor string, args ...string) ([]plugin.CheckResult, error) {
		t.Helper()
		out, _, err := kubectlDKC(t, append([]string{"check", "--kubelet-version", minor, "-o", "json",
			"--kubelet-check-dir", cluster.KubeletCheckDir()}, args...)...)
		var rows []plugin.CheckResult
		if jerr := json.Unmarshal([]byte(out), &rows); jerr != nil {
			t.Fatalf("check --kubelet-version %s -o json: %v (%v)\n%s", minor, jerr, err, out)
		}
		return rows, err
	}
	find := func(rows []plugin.CheckResult, object, config string) plugin.CheckResult {
		t.Helper()
		for _, r := range rows {
			if r.Object == object && r.Config == config {
				return r
			}
		}
		t.Fatalf("no row for %s %s in %+v", object, config, rows)
		return plugin.CheckResult{}
	}

	rows, err := check("1.36")
	if !errors.Is(err, plugin.ErrConfigsRefused) {
		t.Errorf("check with a refused config: %v, want %v", err, plugin.ErrConfigsRefused)
	}
	if r := find(rows, "pool/"+pool, row); r.Result != plugin.CheckRefused || !strings.Contains(r.Error, "unrecognized feature gate: MemoryManager") {
		t.Errorf("kubelet 1.36 on the gated revision: %+v, want refused naming the gate", r)
	}
	rows, _ = check("1.34")
	if r := find(rows, "pool/"+pool, row); r.Result != plugin.CheckOK || r.KubeletVersion == "" || !strings.HasPrefix(r.KubeletVersion, "v1.34.") {
		t.Errorf("kubelet 1.34 on the gated revision: %+v, want ok, checked by a 1.34 kubelet's code", r)
	}

	n, err := adminClient(t).CoreV1().Nodes().Get(testContext(t), realNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	minor := checkapi.Minor(n.Status.NodeInfo.KubeletVersion)
	rows, err = check(minor, realNode)
	if err != nil || len(rows) != 1 || rows[0].Object != "node/"+realNode || rows[0].Result != plugin.CheckOK {
		t.Errorf("kubelet %s on the config node %s runs with it: %v %+v, want one row, ok", minor, realNode, err, rows)
	}
	if _, _, err := kubectlDKC(t, "check", "--kubelet-version", "1.99", "--kubelet-check-dir", cluster.KubeletCheckDir()); err == nil ||
		!strings.Contains(err.Error(), "kubelet minors 1.34") {
		t.Errorf("check with a minor no helper speaks: %v, want the helpers' range", err)
	}
}

// TestKubectlDKCDiffNamesPodsThatNoLongerFit: `kubectl dkc diff` of a config that lowers maxPods below the
// pods bound to the real node shows the node's allocatable now and under the config, and names the pod the
// kubelet may reject when it restarts with it: the newest (it admits the node's pods again, oldest first),
// with OutOfpods. `kubectl dkc rollout --dry-run` says the same for each node a pool would select, and writes
// nothing. `kubectl dkc assign` refuses it, naming that pod; once the pod is gone, it assigns it: the
// restarted kubelet's allocatable is what diff computed, and it refuses one more pod with OutOfpods. (Which pods it admits again at the restart itself depends on whether
// its Node informer shows the new allocatable yet: a race, hence "may" in the output, not tested.)
func TestKubectlDKCDiffNamesPodsThatNoLongerFit(t *testing.T) {
	resetRealNode(t)
	t.Cleanup(func() { resetRealNode(t) })
	client := adminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	// No controller-manager here to make the namespace's ServiceAccount: the pods need one to be admitted.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "default"}}
	if _, err := client.CoreV1().ServiceAccounts("kube-system").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	existing, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + realNode})
	if err != nil {
		t.Fatal(err)
	}
	bound := 0
	for _, p := range existing.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			bound++
		}
	}
	var last time.Time
	bind := func(name string) {
		t.Helper()
		no := false
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name}, Spec: corev1.PodSpec{
			NodeName: realNode, AutomountServiceAccountToken: &no, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "c", Image: "dkc.invalid/capacity:none"}}}}
		created, err := client.CoreV1().Pods("kube-system").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		last = created.CreationTimestamp.Time
		t.Cleanup(func() {
			_ = client.CoreV1().Pods("kube-system").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		})
	}
	for _, name := range []string{"capacity-a", "capacity-b"} {
		// One second apart at least: creation times have seconds, and the kubelet admits the older first.
		poll.For(t, 5*time.Second, 50*time.Millisecond, "a new second", func() bool { return time.Now().Truncate(time.Second).After(last) })
		bind(name)
	}
	// phases reads the two pods' phases, failing the test on a pod the kubelet refused for another reason.
	phases := func() (a, b *corev1.Pod) {
		t.Helper()
		var out [2]*corev1.Pod
		for i, name := range []string{"capacity-a", "capacity-b"} {
			p, err := client.CoreV1().Pods("kube-system").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out[i] = p
		}
		return out[0], out[1]
	}
	// Admitted by the kubelet (its status written: the pods count against its allocatable), not refused.
	poll.For(t, time.Minute, 200*time.Millisecond, "the kubelet to admit both pods", func() bool {
		a, b := phases()
		for _, p := range []*corev1.Pod{a, b} {
			if p.Status.Phase == corev1.PodFailed {
				t.Fatalf("the kubelet refused pod %s: %s: %s", p.Name, p.Status.Reason, p.Status.Message)
			}
		}
		return len(a.Status.Conditions) > 1 && len(b.Status.Conditions) > 1
	})
	createConfigMap(t, "cli-capacity", map[string]string{"kubelet": kubeletConfig(t, fmt.Sprintf(
		"maxPods: %d\nsystemReserved:\n  cpu: 100m\n  memory: 64Mi\n", bound+1))})
	out, _, err := kubectlDKC(t, "diff", realNode, "--configmap", "kube-system/cli-capacity", "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("diff: %v\n%s", err, out)
	}
	finding := fmt.Sprintf("%s: kube-system/capacity-b may not be admitted again when the kubelet restarts (it admits the "+
		"node's pods again, oldest first): pod %d of %d allowed (OutOfpods)", realNode, bound+2, bound+1)
	for _, want := range []string{"maxPods", "capacity of node " + realNode, finding} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}
	// RESOURCE NOW NEW REQUESTED: the new maxPods, and the pods bound to the node.
	if row := fmt.Sprintf(`(?m)^pods\s+\d+\s+%d\s+%d$`, bound+1, bound+2); !regexp.MustCompile(row).MatchString(out) {
		t.Errorf("diff has no pods row matching %s:\n%s", row, out)
	}
	if strings.Contains(out, "kube-system/capacity-a may") {
		t.Errorf("diff names the older pod, which the kubelet admits first:\n%s", out)
	}

	diffOut := out
	// rollout --dry-run: the same finding for each node the pool would select, and nothing written.
	out, _, err = kubectlDKC(t, "rollout", "capacity-preview", "--dry-run", "--configmap", "kube-system/cli-capacity",
		"-l", "kubernetes.io/hostname="+realNode, "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("rollout --dry-run: %v\n%s", err, out)
	}
	for _, want := range []string{"dry run, nothing written", "disruptive", finding} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout --dry-run lacks %q:\n%s", want, out)
		}
	}
	if _, err := cluster.KubeletConfigPool(ctx, "capacity-preview"); !apierrors.IsNotFound(err) {
		t.Errorf("rollout --dry-run wrote the pool: %v", err)
	}

	// What was computed is what the kubelet does: restarted with the config, it reports the allocatable diff
	// showed, and refuses a pod past maxPods with OutOfpods.
	predicted := map[corev1.ResourceName]resource.Quantity{}
	for _, r := range []corev1.ResourceName{corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory} {
		m := regexp.MustCompile(`(?m)^` + string(r) + `\s+\S+\s+(\S+)\s`).FindStringSubmatch(diffOut)
		if m == nil {
			t.Fatalf("diff has no %s row:\n%s", r, diffOut)
		}
		predicted[r] = resource.MustParse(m[1])
	}
	// assign refuses it while capacity-b runs there, naming it: the restarted kubelet would fail it.
	refused := fmt.Sprintf("%s: kube-system/capacity-b: pod %d of %d allowed (OutOfpods)", realNode, bound+2, bound+1)
	if out, _, err := kubectlDKC(t, "assign", realNode, "--configmap", "kube-system/cli-capacity",
		"--kubelet-check-dir", cluster.KubeletCheckDir()); err == nil || !strings.Contains(err.Error(), refused) ||
		!strings.Contains(err.Error(), "nothing was assigned") {
		t.Fatalf("assign while capacity-b runs: %v, want a refusal naming %q\n%s", err, refused, out)
	}
	// Gone from the API and from the kubelet (whose /pods the node's sidecar predicts from), it is assigned.
	if err := client.CoreV1().Pods("kube-system").Delete(ctx, "capacity-b",
		metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	poll.For(t, time.Minute, 200*time.Millisecond, "the kubelet to drop capacity-b", func() bool {
		raw, err := client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", realNode, "proxy", "pods").DoRaw(ctx)
		return err == nil && !strings.Contains(string(raw), `"capacity-b"`)
	})
	if out, _, err := kubectlDKC(t, "assign", realNode, "--configmap", "kube-system/cli-capacity",
		"--kubelet-check-dir", cluster.KubeletCheckDir()); err != nil {
		t.Fatalf("assign: %v\n%s", err, out)
	}
	var alloc corev1.ResourceList
	poll.For(t, 4*time.Minute, time.Second, "the restarted kubelet to report its allocatable", func() bool {
		n, err := client.CoreV1().Nodes().Get(ctx, realNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		alloc = n.Status.Allocatable
		p := alloc[corev1.ResourcePods]
		return p.Value() == int64(bound+1)
	})
	for r, want := range predicted {
		if got := alloc[r]; got.Cmp(want) != 0 {
			t.Errorf("the kubelet's allocatable %s under the config: %s; diff computed %s", r, got.String(), want.String())
		}
	}
	poll.For(t, 5*time.Second, 50*time.Millisecond, "a new second", func() bool { return time.Now().Truncate(time.Second).After(last) })
	bind("capacity-c")
	poll.For(t, time.Minute, 200*time.Millisecond, "the kubelet to refuse capacity-c", func() bool {
		p, err := client.CoreV1().Pods("kube-system").Get(ctx, "capacity-c", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodFailed && p.Status.Reason != "OutOfpods" {
			t.Fatalf("capacity-c refused with %s: %s, want OutOfpods", p.Status.Reason, p.Status.Message)
		}
		return p.Status.Phase == corev1.PodFailed
	})
}
