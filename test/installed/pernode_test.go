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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/poll"
)

// perNodeDivisor is the formula's divisor of each node's memory capacity: the installed form's two nodes
// share the host's memory, so the formula tells them apart by name too.
var perNodeDivisor = map[string]int64{"node-1": 64, "node-2": 32}

// perNodeSpec computes systemReserved.memory from each node's memory capacity: 1/64 of it on node-1,
// 1/32 on node-2, in MiB.
const perNodeSpec = `  maxUnavailable: 1
  perNode:
    values:
      - field: systemReserved.memory
        expression: >-
          string(int(quantity(node.status.capacity.memory).asApproximateFloat() / 1048576.0 /
          (node.metadata.labels['kubernetes.io/hostname'] == 'node-1' ? 64.0 : 32.0))) + 'Mi'
`

// TestPerNodeValuesOnRealNodes rolls out a pool whose systemReserved.memory is a formula over each
// node's memory capacity (spec.perNode), on the installed form's two real nodes:
//   - `kubectl dkc rollout --dry-run` shows each node's computed value;
//   - each node runs its own value (/configz), from a revision of its own (status.nodeRevisions), one
//     node at a time;
//   - an exception giving node-2 a value its kubelet's validation refuses (maxPods -1) fails node-2 before it
//     is touched, and halts the pool;
//   - one only the kubelet's start refuses (a negative reservation) is assigned to node-2, rolled back, and
//     halts the pool; node-1 is never touched;
//   - the exception removed, node-2's failure goes with its revision and the pool completes again.
func TestPerNodeValuesOnRealNodes(t *testing.T) {
	resetAfter(t)
	const pool = "installed-pernode"
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	createConfig(t, pool, "node-1", 46)
	want := map[string]string{}
	for _, n := range nodes {
		node, err := admin(t).CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		capacity := node.Status.Capacity[corev1.ResourceMemory]
		want[n] = fmt.Sprintf("%dMi", int64(capacity.AsApproximateFloat64()/1048576.0/float64(perNodeDivisor[n])))
	}
	t.Logf("each node's systemReserved.memory by the formula: %v", want)

	// 1. The dry run shows each node's value, writing nothing.
	applyPool(t, pool, perNodeSpec+"  paused: true\n")
	out, err := kubectlDKC(ctx, "rollout", pool, "--dry-run", "--kubelet-check-dir", cluster.KubeletCheckDir())
	if err != nil {
		t.Fatalf("kubectl dkc rollout --dry-run: %v\n%s", err, out)
	}
	for _, n := range nodes {
		if line := lineOf(out, n); !strings.Contains(line, `systemReserved.memory="`+want[n]+`"`) {
			t.Errorf("dry run: node %s's line %q lacks its value %s\n%s", n, line, want[n], out)
		}
	}
	t.Logf("kubectl dkc rollout --dry-run:\n%s", out)

	// 2. Each node runs its own value, one node at a time.
	since := time.Now()
	if out, err := kubectlDKC(ctx, "rollout", "resume", pool); err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	if out, err := kubectlDKC(ctx, "rollout", "status", pool, "--timeout", "4m"); err != nil || !strings.Contains(out, "rollout complete") {
		t.Fatalf("rollout status: %v\n%s", err, out)
	}
	p := getPool(t, pool)
	if len(p.Status.NodeRevisions) != 2 {
		t.Fatalf("status.nodeRevisions %+v, want one revision per node", p.Status.NodeRevisions)
	}
	own := map[string]*corev1.ConfigMap{} // each node's own snapshot
	for _, n := range nodes {
		a := assignmentOn(t, n)
		cm, err := admin(t).CoreV1().ConfigMaps("kube-system").Get(ctx, v1alpha1.SnapshotName(pool, a.Revision), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s's own snapshot: %v", n, err)
		}
		if cm.Labels[v1alpha1.LabelBaseRevision] != p.Status.CurrentRevision {
			t.Errorf("%s runs %s, labelled base revision %q, want the pool's %s", n, cm.Name,
				cm.Labels[v1alpha1.LabelBaseRevision], p.Status.CurrentRevision)
		}
		own[n] = cm
		waitRunning(t, n, cm, time.Minute)
		if got := reservedMemory(t, n); got != want[n] {
			t.Errorf("%s: configz systemReserved.memory %q, want its own %q", n, got, want[n])
		}
	}
	if own["node-1"].Name == own["node-2"].Name {
		t.Errorf("both nodes run %s: the values did not make a revision each", own["node-1"].Name)
	}
	oneAtATime(t, since)
	t.Logf("node revisions: %+v", p.Status.NodeRevisions)

	// 3a. An exception the kubelet's validation refuses (maxPods -1): checked with node-2's minor before it
	// is touched, node-2 fails ConfigRefused and the pool halts; no kubelet restarts.
	since = time.Now()
	patchPerNode(t, pool, `[{"name":"incident-4711","node":"node-2","patch":{"maxPods":-1}}]`)
	f := waitHaltedOn(t, pool, v1alpha1.FailureConfigRefused)
	if !strings.Contains(f.Error, "before the node is touched") || !strings.Contains(f.Error, "maxPods") {
		t.Errorf("node-2's refusal %q does not say it was checked before the node was touched, naming maxPods", f.Error)
	}
	for _, n := range nodes {
		if s := startsSince(t, n, since); len(s) != 0 {
			t.Errorf("%s: kubelet started %v for a value refused before any node was touched", n, s)
		}
	}

	// 3b. One that only the kubelet itself refuses, at its start (a negative reservation: its validation
	// lets it through): node-2 is assigned its own revision, its kubelet does not come up on it and is
	// rolled back, and the pool halts; node-1 is not touched. 3a's failure went with its revision.
	since = time.Now()
	patchPerNode(t, pool, `[{"name":"incident-4711","node":"node-2","patch":{"systemReserved":{"memory":"-1Mi"}}}]`)
	f = waitHaltedOn(t, pool, v1alpha1.FailureRolledBack)
	if s := startsSince(t, "node-2", since); len(s) == 0 {
		t.Errorf("node-2: no kubelet start, want the restart onto its refused value (and the rollback)")
	}
	if s := startsSince(t, "node-1", since); len(s) != 0 {
		t.Errorf("node-1: kubelet started %v for node-2's exception", s)
	}
	waitConfigzMemory(t, "node-2", want["node-2"]) // back on its last-known-good

	// 4. The exception removed: node-2's own revision is the one it ran, its failure goes, and the pool
	// completes.
	patchPerNode(t, pool, `null`)
	if out, err := kubectlDKC(ctx, "rollout", "status", pool, "--timeout", "4m"); err != nil || !strings.Contains(out, "rollout complete") {
		t.Fatalf("rollout status after the exception is removed: %v\n%s", err, out)
	}
	waitRunning(t, "node-2", own["node-2"], time.Minute)
	waitRunning(t, "node-1", own["node-1"], time.Minute)
	if p := getPool(t, pool); len(p.Status.FailedNodes) != 0 {
		t.Errorf("failed nodes %+v after the exception is removed, want none", p.Status.FailedNodes)
	}
}

// lineOf is the line of out whose first field is node.
func lineOf(out, node string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == node {
			return l
		}
	}
	return ""
}

// assignmentOn is the pool assignment recorded on node.
func assignmentOn(t *testing.T, node string) v1alpha1.Assignment {
	t.Helper()
	n, err := admin(t).CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var a v1alpha1.Assignment
	if err := json.Unmarshal([]byte(n.Annotations[v1alpha1.AnnotationAssignment]), &a); err != nil {
		t.Fatalf("%s's assignment %q: %v", node, n.Annotations[v1alpha1.AnnotationAssignment], err)
	}
	return a
}

// reservedMemory is systemReserved.memory as node's kubelet runs it (/configz).
func reservedMemory(t *testing.T, node string) string {
	t.Helper()
	var r struct {
		Memory string `json:"memory"`
	}
	if raw := configzField(t, node, "systemReserved"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatalf("%s's systemReserved %s: %v", node, raw, err)
		}
	}
	return r.Memory
}

// waitConfigzMemory waits until node's kubelet serves /configz with systemReserved.memory want.
func waitConfigzMemory(t *testing.T, node, want string) {
	t.Helper()
	poll.ForNil(t, 2*time.Minute, time.Second, node+"'s kubelet running systemReserved.memory "+want, func() error {
		raw, err := admin(t).CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/configz").DoRaw(ctxFor(t))
		if err != nil {
			return err
		}
		if !strings.Contains(string(raw), `"systemReserved":{"memory":"`+want+`"}`) {
			return fmt.Errorf("configz: %.300s", raw)
		}
		return nil
	})
}

// patchPerNode sets the pool's spec.perNode.exceptions to exceptions (JSON; null removes them).
func patchPerNode(t *testing.T, pool, exceptions string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"perNode":{"exceptions":%s}}}`, exceptions)
	if _, err := pools(t).Patch(ctxFor(t), pool, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch the pool's exceptions: %v", err)
	}
}

// waitHaltedOn waits for the pool to halt on node-2 alone failing for reason, with its own revision of the
// pool's revision, and returns the failure.
func waitHaltedOn(t *testing.T, pool, reason string) v1alpha1.FailedNode {
	t.Helper()
	var f v1alpha1.FailedNode
	poll.ForNil(t, 4*time.Minute, time.Second, "pool "+pool+" halted on node-2 "+reason, func() error {
		p := getPool(t, pool)
		if !meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionHalted) {
			return fmt.Errorf("not halted: nodes %+v, failed %+v", p.Status.Nodes, p.Status.FailedNodes)
		}
		if len(p.Status.FailedNodes) != 1 || p.Status.FailedNodes[0].Name != "node-2" ||
			p.Status.FailedNodes[0].Reason != reason {
			return fmt.Errorf("failed nodes %+v, want node-2 alone, %s", p.Status.FailedNodes, reason)
		}
		f = p.Status.FailedNodes[0]
		if f.PoolRevision != p.Status.CurrentRevision || f.Revision == p.Status.CurrentRevision {
			return fmt.Errorf("node-2 failed revision %s of pool revision %q, want its own revision of %s", f.Revision,
				f.PoolRevision, p.Status.CurrentRevision)
		}
		return nil
	})
	t.Logf("halted: node-2 failed its own revision %s: %s: %s", f.Revision, f.Reason, f.Error)
	return f
}
