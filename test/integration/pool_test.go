// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
)

// KubeletConfigPools on the simulated nodes (docs/design.md, "KubeletConfigPool"): dkc-server's pool
// controller, which the process form runs under leader election with the CRD from deploy/crds, rolls a
// pool out, halts it and leaves it alone when nothing changed.

// The pools select three of the simulated nodes, labelled for the test by applyPool: enough for two batches
// and a node never assigned after a halt, and each node a pool rolls out to one at a time costs a trial.
const (
	poolLabel    = "dkc.dev/pool-test"
	poolSelector = poolLabel + "=true"
)

func poolSims() []string { return sims()[:3] }

// simMinor is the kubelet minor the simulated nodes report (status.nodeInfo.kubeletVersion), with whose
// code dkc-server checks their pools' configs.
func simMinor(t *testing.T) string {
	t.Helper()
	n, err := adminClient(t).CoreV1().Nodes().Get(testContext(t), poolSims()[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	minor := checkapi.Minor(n.Status.NodeInfo.KubeletVersion)
	if minor == "" {
		t.Fatalf("node %s reports kubelet version %q", n.Name, n.Status.NodeInfo.KubeletVersion)
	}
	return minor
}

// noKubeletStarts is a config that validates but that no kubelet runs with: its image service's socket
// does not exist, so the kubelet exits after it started (the stand-in kubelet as the kubelet does; the
// real nodes' pool tests use a missing container runtime socket, which the simulated nodes set by flag,
// and a flag wins over the config). The sidecar sees it never healthy and rolls the node back.
const noKubeletStarts = "imageServiceEndpoint: unix:///run/dkc-no-such-image-service.sock\n"

// poolHeader is what every simulated node's kubelet accepts (the CLI rollout tests' configs).
const poolHeader = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"

func poolManifest(name, configMap string, maxUnavailable string) string {
	return fmt.Sprintf(`apiVersion: dkc.dev/v1alpha1
kind: KubeletConfigPool
metadata:
  name: %s
spec:
  nodeSelector: {matchLabels: {dkc.dev/pool-test: "true"}}
  configMap: {namespace: kube-system, name: %s, kubeletConfigKey: kubelet}
  maxUnavailable: %s
  maxFailures: 1
  nodeTimeout: 5m
`, name, configMap, maxUnavailable)
}

func poolClient(t *testing.T) dynamic.ResourceInterface {
	t.Helper()
	pools, err := cluster.Pools()
	if err != nil {
		t.Fatal(err)
	}
	return pools
}

func getPool(t *testing.T, name string) *v1alpha1.KubeletConfigPool {
	t.Helper()
	p, err := cluster.KubeletConfigPool(testContext(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// applyPool applies the pool with kubectl (what a GitOps tool does) on the nodes usePool labels.
func applyPool(t *testing.T, manifest string) string {
	t.Helper()
	usePool(t, strings.Fields(strings.SplitN(manifest, "name: ", 2)[1])[0])
	return kubectl(t, manifest, "apply", "-f", "-")
}

// usePool labels the pool tests' simulated nodes (poolSelector) and, at the test's end, deletes the pool
// name and puts the nodes back on their local config, without the label, the pool's assignment record or
// its revisions.
func usePool(t *testing.T, name string) { usePoolOn(t, name, poolSims()) }

// usePoolOn is usePool on the given simulated nodes.
func usePoolOn(t *testing.T, name string, nodes []string) {
	t.Helper()
	for _, s := range nodes {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, poolLabel)
		if _, err := adminClient(t).CoreV1().Nodes().Patch(testContext(t), s, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("label %s for the pool: %v", s, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = poolClient(t).Delete(ctx, name, metav1.DeleteOptions{})
		// Pools have no finalizer; wait until it is gone all the same, so that no later test meets it.
		_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			_, err := poolClient(t).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		_, _, _ = kubectlDKC(t, "reset", "-l", poolSelector)
		for _, s := range nodes {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null},"annotations":{%q:null}}}`, poolLabel, v1alpha1.AnnotationAssignment)
			_, _ = adminClient(t).CoreV1().Nodes().Patch(ctx, s, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		}
		// The controller keeps the revisions the nodes used until they use none: a later run starts
		// without them.
		_ = adminClient(t).CoreV1().ConfigMaps("kube-system").DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + name})
	})
}

// simsOn are the pool's simulated nodes whose source is the ConfigMap name, and of them those that run it as
// last-known-good (proven), from one List: one consistent view, so a node proven and the next one
// assigned between two reads never look like two in progress.
func simsOn(t *testing.T, cm string) (assigned, proven []string) {
	t.Helper()
	nodes, err := adminClient(t).CoreV1().Nodes().List(testContext(t), metav1.ListOptions{LabelSelector: poolSelector})
	if err != nil {
		t.Fatal(err)
	}
	named := func(s *corev1.NodeConfigSource) bool { return s != nil && s.ConfigMap != nil && s.ConfigMap.Name == cm }
	for _, n := range nodes.Items {
		var src corev1.NodeConfigSource
		if raw := n.Annotations[nodeconfig.SourceAnnotation]; raw == "" || json.Unmarshal([]byte(raw), &src) != nil || !named(&src) {
			continue
		}
		assigned = append(assigned, n.Name)
		var st corev1.NodeConfigStatus
		if raw := n.Annotations[nodeconfig.StatusAnnotation]; raw != "" && json.Unmarshal([]byte(raw), &st) == nil && named(st.Active) && named(st.LastKnownGood) {
			proven = append(proven, n.Name)
		}
	}
	return assigned, proven
}

func condition(p *v1alpha1.KubeletConfigPool, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{Type: typ, Status: metav1.ConditionUnknown}
}

// waitPool polls the pool until done says so, calling sample on each observation; it fails the test at
// the limit.
func waitPool(t *testing.T, name string, limit time.Duration, sample func(*v1alpha1.KubeletConfigPool), done func(*v1alpha1.KubeletConfigPool) bool) *v1alpha1.KubeletConfigPool {
	t.Helper()
	var p *v1alpha1.KubeletConfigPool
	poll.ForNil(t, limit, 250*time.Millisecond, "pool "+name, func() error {
		p = getPool(t, name)
		if sample != nil {
			sample(p)
		}
		if done(p) {
			return nil
		}
		return fmt.Errorf("generation %d observed %d, revision %q, nodes %+v, conditions %+v",
			p.Generation, p.Status.ObservedGeneration, p.Status.CurrentRevision, p.Status.Nodes, p.Status.Conditions)
	})
	return p
}

// TestPoolRollsOutOneNodeAtATime: a pool of three simulated nodes with maxUnavailable 1 rolls out to every
// node, and never has two in progress — sampled from the pool's status and, independently, from the
// Nodes (assigned the revision and not yet proven). Then `kubectl apply` of the unchanged pool changes
// nothing: not the pool (no status write), not a node, no new revision.
func TestPoolRollsOutOneNodeAtATime(t *testing.T) {
	createConfigMap(t, "pool-roll", map[string]string{"kubelet": poolHeader + "eventRecordQPS: 37\n"})
	manifest := poolManifest("pool-roll", "pool-roll", "1")
	applyPool(t, manifest)

	maxInProgress, maxUnproven := int32(0), 0
	start := time.Now()
	p := waitPool(t, "pool-roll", 5*time.Minute, func(p *v1alpha1.KubeletConfigPool) {
		maxInProgress = max(maxInProgress, p.Status.Nodes.InProgress)
		if p.Status.CurrentRevision != "" {
			assigned, proven := simsOn(t, "pool-roll-"+p.Status.CurrentRevision)
			maxUnproven = max(maxUnproven, len(assigned)-len(proven))
		}
	}, func(p *v1alpha1.KubeletConfigPool) bool {
		return p.Status.ObservedGeneration == p.Generation && condition(p, v1alpha1.ConditionUpdated).Status == metav1.ConditionTrue
	})
	t.Logf("rolled out to %d nodes in %v", p.Status.Nodes.Updated, time.Since(start).Round(time.Second))
	if p.Status.Nodes.Selected != int32(len(poolSims())) || p.Status.Nodes.Updated != p.Status.Nodes.Selected {
		t.Errorf("nodes %+v, want all %d selected and updated", p.Status.Nodes, len(poolSims()))
	}
	if maxInProgress > 1 || maxUnproven > 1 {
		t.Errorf("in progress at once: %d by the pool's status, %d by the Nodes; want at most 1 (maxUnavailable 1)", maxInProgress, maxUnproven)
	}
	if maxInProgress == 0 || maxUnproven == 0 {
		t.Errorf("never saw a node in progress (status %d, nodes %d): the sampling missed the rollout", maxInProgress, maxUnproven)
	}
	snapshot := "pool-roll-" + p.Status.CurrentRevision
	cm, err := adminClient(t).CoreV1().ConfigMaps("kube-system").Get(testContext(t), snapshot, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("revision snapshot: %v", err)
	}
	if cm.Immutable == nil || !*cm.Immutable || cm.Labels[v1alpha1.LabelPool] != "pool-roll" {
		t.Errorf("snapshot %s: immutable %v, labels %v", snapshot, cm.Immutable, cm.Labels)
	}

	// GitOps: applying the same manifest again changes nothing.
	nodeRVs := map[string]string{}
	for _, s := range poolSims() {
		n, err := adminClient(t).CoreV1().Nodes().Get(testContext(t), s, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodeRVs[s] = n.Annotations[nodeconfig.SourceAnnotation] + n.Annotations[v1alpha1.AnnotationAssignment]
	}
	before := getPool(t, "pool-roll")
	out := kubectl(t, manifest, "apply", "-f", "-")
	if !strings.Contains(out, "unchanged") {
		t.Errorf("kubectl apply of the unchanged pool: %s", out)
	}
	time.Sleep(5 * time.Second) // a controller that rewrote anything would have done it by now
	after := getPool(t, "pool-roll")
	if after.ResourceVersion != before.ResourceVersion || after.Generation != before.Generation {
		t.Errorf("pool changed: resourceVersion %s → %s, generation %d → %d", before.ResourceVersion, after.ResourceVersion, before.Generation, after.Generation)
	}
	for _, s := range poolSims() {
		n, err := adminClient(t).CoreV1().Nodes().Get(testContext(t), s, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Annotations[nodeconfig.SourceAnnotation] + n.Annotations[v1alpha1.AnnotationAssignment]; got != nodeRVs[s] {
			t.Errorf("node %s reassigned by an unchanged pool: %s", s, got)
		}
	}
	revs, err := adminClient(t).CoreV1().ConfigMaps("kube-system").List(testContext(t), metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=pool-roll"})
	if err != nil {
		t.Fatal(err)
	}
	if len(revs.Items) != 1 {
		t.Errorf("%d revisions of pool-roll, want 1", len(revs.Items))
	}
}

// TestPoolHaltsAfterMaxFailures: a config that validates but keeps the kubelet from starting fails the
// first node (rolled back); with maxFailures 1 the pool halts, names the node and its error, and the other
// nodes are never assigned.
func TestPoolHaltsAfterMaxFailures(t *testing.T) {
	createConfigMap(t, "pool-bad", map[string]string{"kubelet": poolHeader + noKubeletStarts})
	applyPool(t, poolManifest("pool-bad", "pool-bad", "1"))
	p := waitPool(t, "pool-bad", 3*time.Minute, nil, func(p *v1alpha1.KubeletConfigPool) bool {
		return condition(p, v1alpha1.ConditionHalted).Status == metav1.ConditionTrue
	})
	halted := condition(p, v1alpha1.ConditionHalted)
	if halted.Reason != v1alpha1.ReasonFailureBudgetExhausted || !strings.Contains(halted.Message, string(nodeconfig.HealthError)) {
		t.Errorf("Halted %s: %s; want %s naming the node's rollback", halted.Reason, halted.Message, v1alpha1.ReasonFailureBudgetExhausted)
	}
	if len(p.Status.FailedNodes) != 1 || p.Status.FailedNodes[0].Reason != v1alpha1.FailureRolledBack {
		t.Fatalf("failed nodes %+v, want one RolledBack", p.Status.FailedNodes)
	}
	failed := p.Status.FailedNodes[0].Name
	// Halted stays: nothing else is assigned, however long we look.
	time.Sleep(10 * time.Second) // proves a negative: the halted pool assigns no more meanwhile
	assigned, _ := simsOn(t, "pool-bad-"+p.Status.CurrentRevision)
	if len(assigned) != 1 || assigned[0] != failed {
		t.Errorf("nodes assigned the bad revision: %v; want only %s", assigned, failed)
	}
	if p = getPool(t, "pool-bad"); condition(p, v1alpha1.ConditionHalted).Status != metav1.ConditionTrue || p.Status.Nodes.InProgress != 0 {
		t.Errorf("pool no longer halted, or in progress: %+v %+v", p.Status.Nodes, p.Status.Conditions)
	}
	evs, err := adminClient(t).CoreV1().Events("default").List(testContext(t), metav1.ListOptions{
		FieldSelector: "involvedObject.name=pool-bad,reason=Halted"})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no Halted Event on the pool (%v)", err)
	}
}

// TestPoolWithInvalidConfigTouchesNoNode: a ConfigMap that is not a KubeletConfiguration, and one the
// kubelet's own validation refuses (dkc-server checks it with the code of the selected nodes' kubelet
// minor), are refused before any node: ConfigInvalid naming what is wrong, no revision, no node assigned.
func TestPoolWithInvalidConfigTouchesNoNode(t *testing.T) {
	for _, tc := range []struct {
		name, kubelet string
		want          []string // in ConfigInvalid's message
	}{
		{name: "pool-invalid", kubelet: "apiVersion: v1\nkind: Pod\n", want: []string{`kind "Pod", not kubelet.config.k8s.io/v1beta1 KubeletConfiguration`}},
		{name: "pool-refused", kubelet: poolHeader + "eventRecordQPS: -3\n",
			want: []string{"the kubelet " + simMinor(t) + " refuses it", "3 selected nodes run it", "failed to validate config", "eventRecordQPS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cm := createConfigMap(t, tc.name, map[string]string{"kubelet": tc.kubelet})
			applyPool(t, poolManifest(tc.name, tc.name, "100%"))
			p := waitPool(t, tc.name, time.Minute, nil, func(p *v1alpha1.KubeletConfigPool) bool {
				return condition(p, v1alpha1.ConditionConfigInvalid).Status == metav1.ConditionTrue
			})
			c := condition(p, v1alpha1.ConditionConfigInvalid)
			if c.Reason != v1alpha1.ReasonValidationFailed {
				t.Errorf("ConfigInvalid %s: %s; want %s", c.Reason, c.Message, v1alpha1.ReasonValidationFailed)
			}
			for _, want := range append(tc.want, "(revision "+v1alpha1.RevisionName("kube-system", "kubelet", cm.Data)+")") {
				if !strings.Contains(c.Message, want) {
					t.Errorf("ConfigInvalid %q lacks %q", c.Message, want)
				}
			}
			time.Sleep(5 * time.Second) // proves a negative: the refused config is assigned to no node meanwhile
			for _, s := range poolSims() {
				n, err := adminClient(t).CoreV1().Nodes().Get(testContext(t), s, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if a, ok := n.Annotations[v1alpha1.AnnotationAssignment]; ok && strings.Contains(a, tc.name) {
					t.Errorf("node %s assigned by a pool with an invalid config: %s", s, a)
				}
			}
			revs, err := adminClient(t).CoreV1().ConfigMaps("kube-system").List(testContext(t), metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + tc.name})
			if err != nil || len(revs.Items) != 0 {
				t.Errorf("revisions of an invalid config: %d (%v)", len(revs.Items), err)
			}
			evs, err := adminClient(t).CoreV1().Events("default").List(testContext(t), metav1.ListOptions{
				FieldSelector: "involvedObject.name=" + tc.name + ",reason=ConfigInvalid"})
			if err != nil || len(evs.Items) == 0 {
				t.Errorf("no ConfigInvalid Event on the pool (%v)", err)
			}
		})
	}
}

// TestPoolRollsOutAnInPlaceEdit: editing the pool's ConfigMap in place is a new revision, rolled out
// maxUnavailable (2) nodes at a time, never all three at once; the first revision, rolled out to all at once
// (100%), stays as the previous one (what an undo assigns).
func TestPoolRollsOutAnInPlaceEdit(t *testing.T) {
	createConfigMap(t, "pool-edit", map[string]string{"kubelet": poolHeader + "eventRecordQPS: 39\n"})
	applyPool(t, poolManifest("pool-edit", "pool-edit", "100%"))
	updated := func(p *v1alpha1.KubeletConfigPool) bool {
		return p.Status.ObservedGeneration == p.Generation && condition(p, v1alpha1.ConditionUpdated).Status == metav1.ConditionTrue
	}
	first := waitPool(t, "pool-edit", 5*time.Minute, nil, updated).Status.CurrentRevision
	// A new maxUnavailable is a new generation, not a new revision: nothing is rolled out.
	kubectl(t, poolManifest("pool-edit", "pool-edit", "2"), "apply", "-f", "-")
	if p := waitPool(t, "pool-edit", time.Minute, nil, updated); p.Status.CurrentRevision != first {
		t.Fatalf("maxUnavailable 100%% → 2 made revision %s from %s", p.Status.CurrentRevision, first)
	}

	cm, err := adminClient(t).CoreV1().ConfigMaps("kube-system").Get(testContext(t), "pool-edit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["kubelet"] = poolHeader + "eventRecordQPS: 40\n"
	if _, err := adminClient(t).CoreV1().ConfigMaps("kube-system").Update(testContext(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	maxInProgress, maxUnproven := int32(0), 0
	p := waitPool(t, "pool-edit", 5*time.Minute, func(p *v1alpha1.KubeletConfigPool) {
		if p.Status.CurrentRevision == first {
			return
		}
		maxInProgress = max(maxInProgress, p.Status.Nodes.InProgress)
		assigned, proven := simsOn(t, "pool-edit-"+p.Status.CurrentRevision)
		maxUnproven = max(maxUnproven, len(assigned)-len(proven))
	}, func(p *v1alpha1.KubeletConfigPool) bool { return p.Status.CurrentRevision != first && updated(p) })
	if p.Status.PreviousRevision != first {
		t.Errorf("previous revision %q, want the first, %q", p.Status.PreviousRevision, first)
	}
	if maxInProgress > 2 || maxUnproven > 2 {
		t.Errorf("in progress at once: %d by the pool's status, %d by the Nodes; want at most 2", maxInProgress, maxUnproven)
	}
	if maxUnproven == 0 {
		t.Error("never saw a node in progress on the new revision: the sampling missed the rollout")
	}
	for _, rev := range []string{first, p.Status.CurrentRevision} {
		if _, err := adminClient(t).CoreV1().ConfigMaps("kube-system").Get(testContext(t), "pool-edit-"+rev, metav1.GetOptions{}); err != nil {
			t.Errorf("revision %s: %v", rev, err)
		}
	}
}
