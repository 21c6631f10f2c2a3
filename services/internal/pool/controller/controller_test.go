// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	poolfake "github.com/dkc-dev/dkc/api/generated/clientset/fake"
	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

const goodConfig = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 42\n"

func configMap(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "blue-config", UID: "cm-uid", ResourceVersion: "1"}, Data: data}
}

func TestCheckConfig(t *testing.T) {
	allowed := resolve.NewNamespaces("kube-system")
	ref := v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "blue-config", KubeletConfigKey: "kubelet"}
	for _, tc := range []struct {
		name   string
		ref    v1alpha1.ConfigMapReference
		cm     *corev1.ConfigMap
		reason string // "" valid
	}{
		{"a KubeletConfiguration", ref, configMap(map[string]string{"kubelet": goodConfig}), ""},
		{"as JSON", ref, configMap(map[string]string{"kubelet": `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration"}`}), ""},
		{"namespace dkc-server does not read", v1alpha1.ConfigMapReference{Namespace: "default", Name: "x", KubeletConfigKey: "kubelet"},
			configMap(map[string]string{"kubelet": goodConfig}), v1alpha1.ReasonNamespaceNotAllowed},
		{"no ConfigMap", ref, nil, v1alpha1.ReasonConfigMapNotFound},
		{"no key", ref, configMap(map[string]string{"other": goodConfig}), v1alpha1.ReasonKeyNotFound},
		{"empty", ref, configMap(map[string]string{"kubelet": ""}), v1alpha1.ReasonValidationFailed},
		{"not YAML", ref, configMap(map[string]string{"kubelet": "{: ["}), v1alpha1.ReasonValidationFailed},
		{"another kind", ref, configMap(map[string]string{"kubelet": "apiVersion: v1\nkind: ConfigMap\n"}), v1alpha1.ReasonValidationFailed},
		{"another version", ref, configMap(map[string]string{"kubelet": "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n"}), v1alpha1.ReasonValidationFailed},
		{"too large", ref, configMap(map[string]string{"kubelet": goodConfig, "big": strings.Repeat("x", 3<<20)}), v1alpha1.ReasonValidationFailed},
	} {
		got := checkConfig(tc.ref, allowed, tc.cm)
		switch {
		case tc.reason == "" && got != nil:
			t.Errorf("%s: invalid (%s: %s), want valid", tc.name, got.Reason, got.Message)
		case tc.reason != "" && (got == nil || got.Reason != tc.reason):
			t.Errorf("%s: %+v, want reason %s", tc.name, got, tc.reason)
		}
	}
}

func testPool() *v1alpha1.KubeletConfigPool {
	mu := intstr.FromInt32(1)
	return &v1alpha1.KubeletConfigPool{
		ObjectMeta: metav1.ObjectMeta{Name: "blue", UID: "pool-uid", Generation: 1},
		Spec: v1alpha1.KubeletConfigPoolSpec{
			NodeSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"pool": "blue"}},
			ConfigMap:      v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "blue-config", KubeletConfigKey: "kubelet"},
			MaxUnavailable: &mu,
		},
	}
}

func sourceJSON(s corev1.ConfigMapNodeConfigSource) string {
	b, _ := json.Marshal(corev1.NodeConfigSource{ConfigMap: &s})
	return string(b)
}

func assignmentJSON(a v1alpha1.Assignment) string {
	b, _ := json.Marshal(a)
	return string(b)
}

// node is a Ready Node whose sidecar reported (a status, "{}" unless annotations has one).
func node(name string, annotations map[string]string, lbls map[string]string) *corev1.Node {
	if lbls == nil {
		lbls = map[string]string{"pool": "blue"}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	if _, ok := annotations[nodeconfig.StatusAnnotation]; !ok {
		annotations[nodeconfig.StatusAnnotation] = "{}"
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-uid"), Labels: lbls, Annotations: annotations},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

// unreported is n without a status: its sidecar never reported.
func unreported(n *corev1.Node) *corev1.Node {
	delete(n.Annotations, nodeconfig.StatusAnnotation)
	return n
}

// withCondition is n with a condition of type typ.
func withCondition(n *corev1.Node, typ corev1.NodeConditionType, status corev1.ConditionStatus, reason,
	msg string) *corev1.Node {
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: typ, Status: status, Reason: reason,
		Message: msg})
	return n
}

func TestView(t *testing.T) {
	pool := testPool()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	target := plan.Target{Revision: "r2", Source: revision.Source(pool, "r2")}
	repair := nodeconfig.DriftRepair{Cause: nodeconfig.DriftWiringRemoved, UID: "u1", ResourceVersion: "7", RequestTime: t0}
	r1 := revision.Source(pool, "r1")
	green, _ := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: map[string]string{"tier": "green"}})
	blue, _ := metav1.LabelSelectorAsSelector(&pool.Spec.NodeSelector)
	others := []selector{{pool: "blue", sel: blue}, {pool: "green", sel: green}}
	allowed := resolve.NewNamespaces("kube-system", "pools")
	// The pool after its spec moved the config to namespace "pools" and key "config": what it assigned
	// before is still its own (recorded in the assignment), not a hand assignment.
	moved := testPool()
	moved.Spec.ConfigMap.Namespace, moved.Spec.ConfigMap.KubeletConfigKey = "pools", "config"
	movedTarget := plan.Target{Revision: "r3", Source: revision.Source(moved, "r3")}
	for _, tc := range []struct {
		name string
		node *corev1.Node
		want plan.Node
		// moved: the pool and target are moved's
		moved bool
	}{
		{"never assigned", node("a", nil, nil), plan.Node{Name: "a", Ready: true}, false},
		{"sidecar never reported", unreported(node("a", nil, nil)), plan.Node{Name: "a", Ready: true, NoStatus: true}, false},
		{"kubelet drifted", withCondition(node("a", nil, nil), nodeconfig.DriftConditionType, corev1.ConditionTrue,
			nodeconfig.DriftFlagOverride, "fields maxPods: --max-pods=30"),
			plan.Node{Name: "a", Ready: true, Drift: "FlagOverride: fields maxPods: --max-pods=30", DriftCause: nodeconfig.DriftFlagOverride},
			false},
		{"asked to repair its drift, for the version it runs", withCondition(node("a", map[string]string{
			nodeconfig.StatusAnnotation:      `{"active":{"configMap":{"uid":"u1","resourceVersion":"7"}}}`,
			nodeconfig.DriftRepairAnnotation: nodeconfig.MarshalDriftRepair(repair),
		}, nil), nodeconfig.DriftConditionType, corev1.ConditionTrue, nodeconfig.DriftWiringRemoved, "drop-in gone"),
			plan.Node{Name: "a", Ready: true, Status: corev1.NodeConfigStatus{Active: &corev1.NodeConfigSource{
				ConfigMap: &corev1.ConfigMapNodeConfigSource{UID: "u1", ResourceVersion: "7"}}},
				Drift: "WiringRemoved: drop-in gone", DriftCause: nodeconfig.DriftWiringRemoved, Repair: &repair}, false},
		{"a repair request of another version asks nothing", node("a", map[string]string{
			nodeconfig.StatusAnnotation:      `{"active":{"configMap":{"uid":"u1","resourceVersion":"8"}}}`,
			nodeconfig.DriftRepairAnnotation: nodeconfig.MarshalDriftRepair(repair),
		}, nil), plan.Node{Name: "a", Ready: true, Status: corev1.NodeConfigStatus{Active: &corev1.NodeConfigSource{
			ConfigMap: &corev1.ConfigMapNodeConfigSource{UID: "u1", ResourceVersion: "8"}}}}, false},
		{"drift cleared", withCondition(node("a", nil, nil), nodeconfig.DriftConditionType, corev1.ConditionFalse,
			nodeconfig.DriftNone, "runs its config"), plan.Node{Name: "a", Ready: true}, false},
		{"a Windows node", node("a", nil, map[string]string{"pool": "blue", corev1.LabelOSStable: "windows"}),
			plan.Node{Name: "a", Ready: true, NoSidecar: "kubernetes.io/os is windows"}, false},
		{"a Linux node", node("a", nil, map[string]string{"pool": "blue", corev1.LabelOSStable: "linux"}),
			plan.Node{Name: "a", Ready: true}, false},
		{"sidecar disabled by label", node("a", nil, map[string]string{"pool": "blue", LabelSidecar: "disabled"}),
			plan.Node{Name: "a", Ready: true, NoSidecar: "labelled dkc.dev/sidecar=disabled"}, false},
		{"assigned the target by the pool", node("a", map[string]string{
			nodeconfig.SourceAnnotation:   sourceJSON(target.Source),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: "r2", Time: metav1.Time{Time: t0}}),
		}, nil), plan.Node{Name: "a", Ready: true, Assigned: true, Revision: "r2", Source: target.Source, AssignedAt: t0}, false},
		{"on the previous revision the pool assigned", node("a", map[string]string{
			nodeconfig.SourceAnnotation:   sourceJSON(r1),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: "r1", Time: metav1.Time{Time: t0}}),
		}, nil), plan.Node{Name: "a", Ready: true, Revision: "r1", Source: r1, AssignedAt: t0}, false},
		{"source changed by hand since", node("a", map[string]string{
			nodeconfig.SourceAnnotation:   sourceJSON(corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "debug", KubeletConfigKey: "kubelet"}),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: "r1", Time: metav1.Time{Time: t0}}),
		}, nil), plan.Node{Name: "a", Ready: true, HandAssigned: true}, false},
		{"set back to the target by hand", node("a", map[string]string{
			nodeconfig.SourceAnnotation:   sourceJSON(target.Source),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: "r1", Time: metav1.Time{Time: t0}}),
		}, nil), plan.Node{Name: "a", Ready: true, Assigned: true}, false},
		{"assigned by another pool: selecting it is the operator's word", node("a", map[string]string{
			nodeconfig.SourceAnnotation:   sourceJSON(corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "green-x", KubeletConfigKey: "kubelet"}),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "green", Revision: "x", Time: metav1.Time{Time: t0}}),
		}, nil), plan.Node{Name: "a", Ready: true}, false},
		{"selected by another pool too", node("a", nil, map[string]string{"pool": "blue", "tier": "green"}),
			plan.Node{Name: "a", Ready: true, OtherPools: []string{"green"}}, false},
		{"not Ready, with a status", func() *corev1.Node {
			n := node("a", map[string]string{nodeconfig.StatusAnnotation: `{"error":"boom"}`}, nil)
			n.Status.Conditions[0].Status = corev1.ConditionFalse
			return n
		}(), plan.Node{Name: "a", Status: corev1.NodeConfigStatus{Error: "boom"}}, false},
		{"assigned before the pool's namespace and key changed", node("a", map[string]string{
			nodeconfig.SourceAnnotation: sourceJSON(r1),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: "r1",
				Namespace: "kube-system", KubeletConfigKey: "kubelet", Time: metav1.Time{Time: t0}}),
		}, nil), plan.Node{Name: "a", Ready: true, Revision: "r1", Source: r1, AssignedAt: t0}, true},
		{"a record without namespace and key is read with the spec's", node("a", map[string]string{
			nodeconfig.SourceAnnotation:   sourceJSON(revision.Source(moved, "r1")),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: "r1", Time: metav1.Time{Time: t0}}),
		}, nil), plan.Node{Name: "a", Ready: true, Revision: "r1", Source: revision.Source(moved, "r1"), AssignedAt: t0}, true},
	} {
		p, tg := pool, target
		if tc.moved {
			p, tg = moved, movedTarget
		}
		got := view(tc.node, p, tg, others, allowed)
		if !equalNode(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

func equalNode(a, b plan.Node) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// fakePools is the generated fake clientset holding items, recording the status writes in updates (they
// leave the fake's objects alone, as the harness's pools live in the informer's cache only); List fails
// with listErr when set (the CRD not installed). Its reactors run under the fake's lock.
type fakePools struct {
	*poolfake.Clientset
	updates []*v1alpha1.KubeletConfigPool
	listErr error
	lists   atomic.Int32
	// statusErrs fail the next status writes, one each.
	statusErrs []error
	// onUpdate, if not nil, is called with every status written (under the fake's lock).
	onUpdate func(*v1alpha1.KubeletConfigPool)
}

func newFakePools(items ...*v1alpha1.KubeletConfigPool) *fakePools {
	objs := make([]runtime.Object, 0, len(items))
	for _, p := range items {
		objs = append(objs, p)
	}
	f := &fakePools{Clientset: poolfake.NewSimpleClientset(objs...)}
	f.PrependReactor("list", v1alpha1.PoolResource, func(k8stesting.Action) (bool, runtime.Object, error) {
		f.lists.Add(1)
		return f.listErr != nil, nil, f.listErr
	})
	f.PrependReactor("update", v1alpha1.PoolResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		up, ok := a.(k8stesting.UpdateActionImpl)
		if !ok || up.GetSubresource() != "status" {
			return true, nil, fmt.Errorf("unexpected %s of %s", a.GetVerb(), a.GetResource().Resource)
		}
		if m := up.UpdateOptions.FieldManager; m != FieldManager {
			return true, nil, fmt.Errorf("status written as field manager %q, want %q", m, FieldManager)
		}
		if len(f.statusErrs) > 0 {
			err := f.statusErrs[0]
			f.statusErrs = f.statusErrs[1:]
			return true, nil, err
		}
		p := up.GetObject().(*v1alpha1.KubeletConfigPool)
		f.updates = append(f.updates, p.DeepCopy())
		if f.onUpdate != nil {
			f.onUpdate(p)
		}
		return true, p, nil
	})
	return f
}

// fakeConfigMaps is a synced tracker holding one ConfigMap.
type fakeConfigMaps struct{ cm *corev1.ConfigMap }

func (f *fakeConfigMaps) Track(string, string) {}
func (f *fakeConfigMaps) Get(string) (*corev1.ConfigMap, bool, error) {
	return f.cm, true, nil
}
func (f *fakeConfigMaps) Nodes(string) []string         { return nil }
func (f *fakeConfigMaps) Run(ctx context.Context) error { <-ctx.Done(); return nil }

type harness struct {
	c        *Controller
	client   *fake.Clientset
	pools    *fakePools
	recorder *record.FakeRecorder
	clock    *clocktesting.FakeClock
	nodes    cache.Indexer
}

// newHarness builds a controller whose caches are filled by hand and never follow its writes: the
// stalest cache there can be.
func newHarness(t *testing.T, pool *v1alpha1.KubeletConfigPool, cm *corev1.ConfigMap, nodes ...*corev1.Node) *harness {
	t.Helper()
	client := fake.NewClientset()
	for _, n := range nodes {
		if _, err := client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	nodeInformer := informers.NewSharedInformerFactory(client, 0).Core().V1().Nodes()
	for _, n := range nodes {
		if err := nodeInformer.Informer().GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	h := &harness{nodes: nodeInformer.Informer().GetIndexer(), client: client, pools: newFakePools(), recorder: record.NewFakeRecorder(100),
		clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	h.c = New(Config{Log: zap.NewNop(), Client: client, Pools: h.pools, Nodes: nodeInformer, Namespaces: resolve.NewNamespaces("kube-system"),
		Recorder: h.recorder, Clock: h.clock, ConfigMaps: func(func(string)) ConfigMaps { return &fakeConfigMaps{cm: cm} }})
	if err := h.c.pools.GetStore().Add(pool); err != nil {
		t.Fatal(err)
	}
	return h
}

// assigned are the nodes patched with a config source so far.
func (h *harness) assigned() []string {
	var out []string
	for _, a := range h.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "nodes" &&
			strings.Contains(string(p.GetPatch()), v1alpha1.AnnotationAssignment) {
			out = append(out, p.GetName())
		}
	}
	return out
}

// TestStaleCacheNeverExceedsMaxUnavailable: the Node cache does not show the controller's assignment yet;
// a second sync must count the assigned node as in progress, not assign another. (Without expectations
// the second sync assigns b.)
func TestStaleCacheNeverExceedsMaxUnavailable(t *testing.T) {
	pool := testPool()
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), node("a", nil, nil), node("b", nil, nil), node("c", nil, nil))
	for i := range 3 {
		if _, err := h.c.sync(context.Background(), "blue"); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		h.clock.Step(time.Second)
	}
	if got := h.assigned(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("assigned %v over three syncs on a stale cache, want [a] (maxUnavailable 1)", got)
	}
	last := h.pools.updates[len(h.pools.updates)-1]
	if last.Status.Nodes.InProgress != 1 || last.Status.CurrentRevision == "" {
		t.Errorf("status nodes %+v revision %q, want 1 in progress and a revision", last.Status.Nodes, last.Status.CurrentRevision)
	}
	// The snapshot was created, labelled with the pool and immutable.
	snap, err := h.client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), revision.SnapshotName("blue", last.Status.CurrentRevision), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if snap.Immutable == nil || !*snap.Immutable || snap.Labels[v1alpha1.LabelPool] != "blue" {
		t.Errorf("snapshot %s: immutable %v, labels %v", snap.Name, snap.Immutable, snap.Labels)
	}
	// What the node got is the snapshot, with the assignment record the planner reads back.
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src, _, err := resolve.NodeSource(n, resolve.NewNamespaces("kube-system"))
	if err != nil || !names(src, revision.Source(pool, last.Status.CurrentRevision)) {
		t.Errorf("node a source %+v (%v), want the snapshot", src, err)
	}
	if a, ok := assignmentOf(n); !ok || a.Pool != "blue" || a.Revision != last.Status.CurrentRevision {
		t.Errorf("node a assignment %+v, want pool blue revision %s", a, last.Status.CurrentRevision)
	}
}

// TestExpectationConfirmedByCache: once the cache shows the assignment, the expectation goes, and the
// node's own status decides (here: proven, so the next node is assigned).
func TestExpectationConfirmedByCache(t *testing.T) {
	pool := testPool()
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), node("a", nil, nil), node("b", nil, nil))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	n, _ := h.client.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
	src, _, _ := resolve.NodeSource(n, resolve.NewNamespaces("kube-system"))
	st, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: src, Active: src, LastKnownGood: src})
	n.Annotations[nodeconfig.StatusAnnotation] = string(st)
	if err := h.nodes.Update(n); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := h.assigned(); len(got) != 2 || got[1] != "b" {
		t.Fatalf("assigned %v, want [a b]", got)
	}
	if h.c.exp.pending("blue") != 1 {
		t.Errorf("%d expectations pending, want 1 (b's; a's confirmed)", h.c.exp.pending("blue"))
	}
}

// TestInvalidConfigTouchesNoNode: a config that is not a KubeletConfiguration sets ConfigInvalid, records
// an Event, creates no revision and patches no Node.
func TestInvalidConfigTouchesNoNode(t *testing.T) {
	h := newHarness(t, testPool(), configMap(map[string]string{"kubelet": "kind: Pod\n"}), node("a", nil, nil))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := h.assigned(); len(got) != 0 {
		t.Errorf("assigned %v with an invalid config", got)
	}
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "configmaps" {
			t.Errorf("created a revision of an invalid config")
		}
	}
	last := h.pools.updates[len(h.pools.updates)-1]
	if c := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionConfigInvalid); c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonValidationFailed {
		t.Errorf("ConfigInvalid %+v, want True ValidationFailed", c)
	}
	select {
	case e := <-h.recorder.Events:
		if !strings.Contains(e, EventConfigInvalid) {
			t.Errorf("event %q, want %s", e, EventConfigInvalid)
		}
	default:
		t.Error("no event")
	}
}

// TestUnchangedStatusIsNotWritten: a second sync that changes nothing writes nothing (kubectl apply of an
// unchanged pool, a resync).
func TestUnchangedStatusIsNotWritten(t *testing.T) {
	pool := testPool()
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}))
	h.recordedSnapshot(t, pool, configMap(map[string]string{"kubelet": goodConfig}))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if len(h.pools.updates) != 1 {
		t.Fatalf("%d status writes, want 1", len(h.pools.updates))
	}
	if err := h.c.pools.GetStore().Update(h.pools.updates[0]); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(time.Minute)
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if len(h.pools.updates) != 1 {
		t.Errorf("%d status writes, want still 1: nothing changed", len(h.pools.updates))
	}
}

// TestRunWithoutTheCRDLogsOnce: dkc-server without the CRD (the benchmark's cluster) keeps running; the
// controller says so once, however often it looks again. (Without the once, every poll logs.)
func TestRunWithoutTheCRDLogsOnce(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	pools := newFakePools()
	pools.listErr = apierrors.NewNotFound(v1alpha1.Resource(v1alpha1.PoolResource), "")
	client := fake.NewClientset()
	c := New(Config{Log: zap.New(core), Client: client, Pools: pools, Nodes: informers.NewSharedInformerFactory(client, 0).Core().V1().Nodes(),
		Namespaces: resolve.NewNamespaces("kube-system"), CRDPollInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := pools.lists.Load(); n < 5 {
		t.Fatalf("looked for the API %d times in 200ms, want it polled", n)
	}
	if n := logs.Len(); n != 1 {
		var msgs []string
		for _, e := range logs.All() {
			msgs = append(msgs, e.Message)
		}
		t.Errorf("%d log lines, want 1: %q", n, msgs)
	}
}

// deletedPoolHarness is a harness whose pool is gone from the cache, with two of its snapshots: used,
// which node a runs, and unused.
func deletedPoolHarness(t *testing.T) (h *harness, used, unused *corev1.ConfigMap) {
	t.Helper()
	pool := testPool()
	_, used = revision.Snapshot(pool, configMap(map[string]string{"kubelet": goodConfig}))
	_, unused = revision.Snapshot(pool, configMap(map[string]string{"kubelet": goodConfig + "eventRecordQPS: 3\n"}))
	src := corev1.ConfigMapNodeConfigSource{Namespace: used.Namespace, Name: used.Name, KubeletConfigKey: "kubelet"}
	h = newHarness(t, pool, nil, node("a", map[string]string{nodeconfig.SourceAnnotation: sourceJSON(src)}, nil))
	if err := h.c.pools.GetStore().Delete(pool); err != nil {
		t.Fatal(err)
	}
	for _, cm := range []*corev1.ConfigMap{used, unused} {
		if _, err := h.client.CoreV1().ConfigMaps(cm.Namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := h.c.snapshots["kube-system"].GetStore().Add(cm); err != nil {
			t.Fatal(err)
		}
	}
	return h, used, unused
}

func (h *harness) exists(t *testing.T, cm *corev1.ConfigMap) bool {
	t.Helper()
	_, err := h.client.CoreV1().ConfigMaps(cm.Namespace).Get(context.Background(), cm.Name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestDeletedPoolRevisionsAreCollected: once a pool is gone, its snapshot no node uses is deleted and
// the one a node still runs is kept (deleting it, the node would report a download failure forever);
// no pool is written (no finalizer to remove).
func TestDeletedPoolRevisionsAreCollected(t *testing.T) {
	h, used, unused := deletedPoolHarness(t)
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if !h.exists(t, used) || h.exists(t, unused) {
		t.Errorf("after sync: used snapshot exists %v (want true), unused %v (want false)", h.exists(t, used), h.exists(t, unused))
	}
	if len(h.assigned()) != 0 || len(h.pools.updates) != 0 {
		t.Errorf("a deleted pool assigned %v and wrote %d statuses", h.assigned(), len(h.pools.updates))
	}
}

// lookalikes are ConfigMaps labelled for pool blue that are not its snapshots: a user's, unlabelled with a
// revision (the pool's source ConfigMap, say); one whose name is not its revision's; a mutable one.
func lookalikes() []*corev1.ConfigMap {
	immutable := true
	cms := []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "blue-config", Labels: map[string]string{v1alpha1.LabelPool: "blue"}}, Immutable: &immutable},
		{ObjectMeta: metav1.ObjectMeta{Name: "mine", Labels: map[string]string{v1alpha1.LabelPool: "blue", v1alpha1.LabelRevision: "r1"}}, Immutable: &immutable},
		{ObjectMeta: metav1.ObjectMeta{Name: "blue-r2", Labels: map[string]string{v1alpha1.LabelPool: "blue", v1alpha1.LabelRevision: "r2"}}},
	}
	for _, cm := range cms {
		cm.Namespace, cm.UID = "kube-system", types.UID("uid-"+cm.Name)
	}
	return cms
}

// TestOnlySnapshotsAreDeleted: collect (a deleted pool) and prune (past the history limit) delete the pool's
// snapshots and never another ConfigMap carrying its label.
func TestOnlySnapshotsAreDeleted(t *testing.T) {
	add := func(t *testing.T, h *harness, cms []*corev1.ConfigMap) {
		t.Helper()
		for _, cm := range cms {
			if _, err := h.client.CoreV1().ConfigMaps(cm.Namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := h.c.snapshots["kube-system"].GetStore().Add(cm); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("collect", func(t *testing.T) {
		h, _, unused := deletedPoolHarness(t)
		add(t, h, lookalikes())
		if _, err := h.c.sync(context.Background(), "blue"); err != nil {
			t.Fatal(err)
		}
		if h.exists(t, unused) {
			t.Error("the unused snapshot was kept")
		}
		for _, cm := range lookalikes() {
			if !h.exists(t, cm) {
				t.Errorf("collect deleted %s, no snapshot", cm.Name)
			}
		}
	})
	t.Run("prune", func(t *testing.T) {
		pool := testPool()
		limit := int32(0)
		pool.Spec.RevisionHistoryLimit = &limit
		h := newHarness(t, pool, nil)
		var snaps []*corev1.ConfigMap
		for i := range 3 {
			_, snap := revision.Snapshot(pool, configMap(map[string]string{"kubelet": fmt.Sprintf("%seventRecordQPS: %d\n", goodConfig, i+1)}))
			snaps = append(snaps, snap)
		}
		add(t, h, append(snaps, lookalikes()...))
		st := v1alpha1.KubeletConfigPoolStatus{CurrentRevision: snaps[0].Labels[v1alpha1.LabelRevision], PreviousRevision: snaps[1].Labels[v1alpha1.LabelRevision]}
		if err := h.c.prune(context.Background(), pool, st, nil, nil); err != nil {
			t.Fatal(err)
		}
		if !h.exists(t, snaps[0]) || !h.exists(t, snaps[1]) || h.exists(t, snaps[2]) {
			t.Errorf("current, previous, third snapshot exist: %v %v %v, want true true false", h.exists(t, snaps[0]), h.exists(t, snaps[1]), h.exists(t, snaps[2]))
		}
		for _, cm := range lookalikes() {
			if !h.exists(t, cm) {
				t.Errorf("prune deleted %s, no snapshot", cm.Name)
			}
		}
	})
}

// TestRecreatedPoolRecreatesItsSnapshot: a pool deleted and re-created under its name with the same config
// needs the snapshot collect just deleted; the snapshot cache, not yet showing the deletion, must not
// make the controller assign nodes to a ConfigMap that is gone.
func TestRecreatedPoolRecreatesItsSnapshot(t *testing.T) {
	pool := testPool()
	cm := configMap(map[string]string{"kubelet": goodConfig})
	_, snap := revision.Snapshot(pool, cm)
	h := newHarness(t, pool, cm)
	if _, err := h.client.CoreV1().ConfigMaps(snap.Namespace).Create(context.Background(), snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.snapshots["kube-system"].GetStore().Add(snap); err != nil {
		t.Fatal(err)
	}
	if err := h.c.pools.GetStore().Delete(pool); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if h.exists(t, snap) {
		t.Fatal("the deleted pool's unused snapshot was not collected")
	}
	if err := h.c.pools.GetStore().Add(pool); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if !h.exists(t, snap) {
		t.Error("the re-created pool's snapshot was not created again (the stale cache still shows it)")
	}
	// Created again, it is the cache's to answer for: no second Create.
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	creates := 0
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "configmaps" {
			creates++
		}
	}
	if creates != 2 {
		t.Errorf("%d ConfigMap creates, want 2 (the test's, the re-creation)", creates)
	}
}

// TestDeletedPoolWaitsForItsLastAssignments: an assignment the pool made just before its deletion may not
// be in the Node cache yet; its snapshots stay until the expectation expires.
func TestDeletedPoolWaitsForItsLastAssignments(t *testing.T) {
	h, _, unused := deletedPoolHarness(t)
	h.c.exp.expect("blue", "b", v1alpha1.Assignment{Pool: "blue", Revision: unused.Labels[v1alpha1.LabelRevision]}, h.clock.Now())
	requeue, err := h.c.sync(context.Background(), "blue")
	if err != nil {
		t.Fatal(err)
	}
	if !h.exists(t, unused) || requeue <= 0 || requeue > expectationTTL {
		t.Errorf("with an unconfirmed assignment: snapshot kept %v (want true), requeue %v (want within %v)", h.exists(t, unused), requeue, expectationTTL)
	}
	h.clock.Step(expectationTTL + time.Second)
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if h.exists(t, unused) {
		t.Error("snapshot kept after the expectation expired")
	}
}

// TestSweepQueuesDeletedPools: a pool deleted while dkc-server was down or another replica led leaves
// snapshots and no event; the sweep queues it, and only it.
func TestSweepQueuesDeletedPools(t *testing.T) {
	pool := testPool()
	h := newHarness(t, pool, nil)
	gone := testPool()
	gone.Name = "gone"
	for _, p := range []*v1alpha1.KubeletConfigPool{pool, gone} {
		_, snap := revision.Snapshot(p, configMap(map[string]string{"kubelet": goodConfig}))
		if err := h.c.snapshots["kube-system"].GetStore().Add(snap); err != nil {
			t.Fatal(err)
		}
	}
	h.c.sweep(context.Background())
	if n := h.c.queue.Len(); n != 1 {
		t.Fatalf("%d pools queued, want 1", n)
	}
	if got, _ := h.c.queue.Get(); got != "gone" {
		t.Errorf("queued %q, want gone", got)
	}
}

// TestAssignmentTimeSurvivesAFailedStatusWrite: the status write after an assignment conflicts; the next
// sync (no assignment: the node is expected in progress) still records when the batch was assigned, which
// pauseBetweenBatches counts from. (Without it, lastAssignmentTime stays unset.)
func TestAssignmentTimeSurvivesAFailedStatusWrite(t *testing.T) {
	pool := testPool()
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), node("a", nil, nil), node("b", nil, nil))
	h.recordedSnapshot(t, pool, configMap(map[string]string{"kubelet": goodConfig}))
	h.pools.statusErrs = []error{apierrors.NewConflict(v1alpha1.Resource(v1alpha1.PoolResource), "blue", nil)}
	assignedAt := h.clock.Now()
	if _, err := h.c.sync(context.Background(), "blue"); !apierrors.IsConflict(err) {
		t.Fatalf("sync: %v, want the Conflict", err)
	}
	h.clock.Step(3 * time.Second)
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := h.assigned(); len(got) != 1 {
		t.Fatalf("assigned %v, want one node", got)
	}
	st := h.pools.updates[len(h.pools.updates)-1].Status
	if st.LastAssignmentTime == nil || !st.LastAssignmentTime.Time.Equal(assignedAt) {
		t.Errorf("lastAssignmentTime %v, want %v", st.LastAssignmentTime, assignedAt)
	}
}

// TestRunAssignsThenStops: Run wires the informers, the shared Node informer's handler and the workers:
// a pool of two nodes gets one assigned (the Node's update comes back through the informer, and no
// second node follows it), and Run returns promptly when its context ends.
func TestRunAssignsThenStops(t *testing.T) {
	client := fake.NewClientset(node("a", nil, nil), node("b", nil, nil))
	factory := informers.NewSharedInformerFactory(client, 0)
	nodes := factory.Core().V1().Nodes()
	nodes.Informer()
	pools := newFakePools(testPool())
	c := New(Config{Log: zap.NewNop(), Client: client, Pools: pools, Nodes: nodes, Namespaces: resolve.NewNamespaces("kube-system"),
		ConfigMaps: func(func(string)) ConfigMaps {
			return &fakeConfigMaps{cm: configMap(map[string]string{"kubelet": goodConfig})}
		}})
	h := &harness{client: client}
	// A wrong second assignment would be made by the sync that first finds the first one in its Node cache
	// (and confirms the assignment expected): that sync writes the pool's status after its assignments.
	var confirmed atomic.Bool
	pools.onUpdate = func(*v1alpha1.KubeletConfigPool) {
		if len(h.assigned()) > 0 && c.exp.pending("blue") == 0 {
			confirmed.Store(true)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	poll.Until(t, "a sync that finds its assignments in the Node cache", confirmed.Load)
	if got := h.assigned(); len(got) != 1 {
		t.Errorf("assigned %v, want one node", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of its context ending")
	}
	factory.Shutdown()
}

// TestHeldNodesAreNotTouched: a node the pool assigned and someone changed by hand since, and a node
// another pool selects too, are held (counted, never patched); the free node is assigned. (Without the
// holds, maxUnavailable 3 would patch all three.)
func TestHeldNodesAreNotTouched(t *testing.T) {
	pool := testPool()
	three := intstr.FromInt32(3)
	pool.Spec.MaxUnavailable = &three
	green := testPool()
	green.Name, green.UID = "green", "green-uid"
	green.Spec.NodeSelector = metav1.LabelSelector{MatchLabels: map[string]string{"tier": "green"}}
	debug := corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "debug", KubeletConfigKey: "kubelet"}
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}),
		node("hand", map[string]string{
			nodeconfig.SourceAnnotation:   sourceJSON(debug),
			v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: "blue", Revision: "old", Time: metav1.Time{Time: h0}}),
		}, nil),
		node("shared", nil, map[string]string{"pool": "blue", "tier": "green"}),
		node("free", nil, nil))
	if err := h.c.pools.GetStore().Add(green); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := h.assigned(); len(got) != 1 || got[0] != "free" {
		t.Errorf("assigned %v, want [free]", got)
	}
	st := h.pools.updates[len(h.pools.updates)-1].Status
	if st.Nodes.Held != 2 {
		t.Errorf("held %d, want 2 (hand, shared)", st.Nodes.Held)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDegraded); c == nil || c.Reason != v1alpha1.ReasonSelectorOverlap || !strings.Contains(c.Message, "blue, green") {
		t.Errorf("Degraded %+v, want SelectorOverlap naming blue, green", c)
	}
}

var h0 = time.Date(2025, 12, 31, 0, 0, 0, 0, time.UTC)

// refusingNode is a node assigned pool's revision of cm that refused it (a config fault: not retried).
func refusingNode(name string, pool *v1alpha1.KubeletConfigPool, cm *corev1.ConfigMap) *corev1.Node {
	rev, _ := revision.Snapshot(pool, cm)
	src := revision.Source(pool, rev)
	st, _ := json.Marshal(corev1.NodeConfigStatus{Assigned: &corev1.NodeConfigSource{ConfigMap: &src}, Error: "failed to validate config"})
	return node(name, map[string]string{
		nodeconfig.SourceAnnotation:   sourceJSON(src),
		nodeconfig.StatusAnnotation:   string(st),
		v1alpha1.AnnotationAssignment: assignmentJSON(v1alpha1.Assignment{Pool: pool.Name, Revision: rev}),
	}, nil)
}

func drain(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestEventsOnlyAfterTheStatusWrite: a status write that conflicts records no Event and counts no halt
// (the retry would repeat them); the write that succeeds records Halted, then NodeFailed, once.
func TestEventsOnlyAfterTheStatusWrite(t *testing.T) {
	pool := testPool()
	cm := configMap(map[string]string{"kubelet": goodConfig})
	h := newHarness(t, pool, cm, refusingNode("a", pool, cm))
	h.c.cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	h.pools.statusErrs = []error{apierrors.NewConflict(v1alpha1.Resource(v1alpha1.PoolResource), "blue", nil)}
	if _, err := h.c.sync(context.Background(), "blue"); !apierrors.IsConflict(err) {
		t.Fatalf("sync: %v, want the Conflict", err)
	}
	if got := drain(h.recorder); len(got) != 0 {
		t.Errorf("events before the status was stored: %q", got)
	}
	if n := testutil.ToFloat64(h.c.cfg.Metrics.halts.WithLabelValues("blue")); n != 0 {
		t.Errorf("halts_total %v before the status was stored", n)
	}
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	got := drain(h.recorder)
	if len(got) != 2 || !strings.Contains(got[0], EventHalted) || !strings.Contains(got[1], EventNodeFailed) {
		t.Errorf("events %q, want Halted then NodeFailed", got)
	}
	if n := testutil.ToFloat64(h.c.cfg.Metrics.halts.WithLabelValues("blue")); n != 1 {
		t.Errorf("halts_total %v, want 1", n)
	}
	if v := testutil.ToFloat64(h.c.cfg.Metrics.halted.WithLabelValues("blue")); v != 1 {
		t.Errorf("dkc_pool_halted %v, want 1", v)
	}
	h.c.cfg.Metrics.forget("blue")
	if n := testutil.CollectAndCount(h.c.cfg.Metrics.halted); n != 0 {
		t.Errorf("%d dkc_pool_halted series after the pool went, want none", n)
	}
}

// TestEventsPerBatch: many nodes failing at once make one NodeFailed Event, and a batch of assignments
// one Assigned Event, not one per node.
func TestEventsPerBatch(t *testing.T) {
	pool := testPool()
	many := int32(100)
	pool.Spec.MaxFailures = &many
	cm := configMap(map[string]string{"kubelet": goodConfig})
	var nodes []*corev1.Node
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		nodes = append(nodes, refusingNode(n, pool, cm))
	}
	h := newHarness(t, pool, cm, nodes...)
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := drain(h.recorder); len(got) != 1 || !strings.Contains(got[0], EventNodeFailed) || !strings.Contains(got[0], "5 nodes failed") {
		t.Errorf("events %q, want one NodeFailed summing up 5 nodes", got)
	}

	pool = testPool()
	three := intstr.FromInt32(3)
	pool.Spec.MaxUnavailable = &three
	h = newHarness(t, pool, cm, node("a", nil, nil), node("b", nil, nil), node("c", nil, nil))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := drain(h.recorder); len(got) != 1 || !strings.Contains(got[0], EventAssigned) || !strings.Contains(got[0], "3 node(s): a, b, c") {
		t.Errorf("events %q, want one Assigned naming a, b, c", got)
	}
}

// TestPartialBatchKeepsItsAssignmentTime: a patch that fails mid-batch still leaves the time of the
// assignments made before it, which starts pauseBetweenBatches.
func TestPartialBatchKeepsItsAssignmentTime(t *testing.T) {
	pool := testPool()
	two := intstr.FromInt32(2)
	pool.Spec.MaxUnavailable = &two
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), node("a", nil, nil), node("b", nil, nil))
	h.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetName() == "b" {
			return true, nil, apierrors.NewServiceUnavailable("down")
		}
		return false, nil, nil
	})
	if _, err := h.c.sync(context.Background(), "blue"); err == nil {
		t.Fatal("sync succeeded though a patch failed")
	}
	if got := h.c.withAssignmentTime(pool).Status.LastAssignmentTime; got == nil || !got.Time.Equal(h.clock.Now()) {
		t.Errorf("assignment time %v after a cut-short batch, want %v", got, h.clock.Now())
	}
	if got := drain(h.recorder); len(got) != 1 || !strings.Contains(got[0], "1 node(s): a") {
		t.Errorf("events %q, want one Assigned naming a", got)
	}
}

// blockingConfigMaps holds a sync in Get until release is closed: a sync in flight when Run's context ends.
type blockingConfigMaps struct {
	fakeConfigMaps
	entered chan struct{}
	once    sync.Once
	release chan struct{}
}

func (b *blockingConfigMaps) Get(key string) (*corev1.ConfigMap, bool, error) {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	return b.fakeConfigMaps.Get(key)
}

// TestRunResetsMetricsLast: a sync still running when the term ends sets the pool's gauges on its way
// out; Run clears them only after its workers returned, so a replica that no longer leads exports none.
func TestRunResetsMetricsLast(t *testing.T) {
	client := fake.NewClientset(node("a", nil, nil))
	factory := informers.NewSharedInformerFactory(client, 0)
	nodes := factory.Core().V1().Nodes()
	nodes.Informer()
	cms := &blockingConfigMaps{fakeConfigMaps: fakeConfigMaps{cm: configMap(map[string]string{"kubelet": goodConfig})},
		entered: make(chan struct{}), release: make(chan struct{})}
	metrics := NewMetrics(prometheus.NewRegistry())
	c := New(Config{Log: zap.NewNop(), Client: client, Pools: newFakePools(testPool()), Nodes: nodes,
		Namespaces: resolve.NewNamespaces("kube-system"), Metrics: metrics, ConfigMaps: func(func(string)) ConfigMaps { return cms }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-cms.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no sync within 10s")
	}
	cancel()
	// Run sees its context end (and shuts its queue down) while the sync is in flight.
	poll.Until(t, "Run to shut its queue down", c.queue.ShuttingDown)
	close(cms.release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := testutil.CollectAndCount(metrics.nodes); n != 0 {
		t.Errorf("%d dkc_pool_nodes series after Run returned, want none", n)
	}
}

// TestAssignedEventNamesAReplacedSource: a selected node whose source the pool never set (by hand, by
// another tool) is assigned, and the Event names what was replaced; a node on the local config is not
// said to replace anything.
func TestAssignedEventNamesAReplacedSource(t *testing.T) {
	pool := testPool()
	two := intstr.FromInt32(2)
	pool.Spec.MaxUnavailable = &two
	debug := corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "debug", KubeletConfigKey: "kubelet"}
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}),
		node("a", map[string]string{nodeconfig.SourceAnnotation: sourceJSON(debug)}, nil), node("b", nil, nil))
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if got := drain(h.recorder); len(got) != 1 || !strings.Contains(got[0], "a (replacing kube-system/debug), b") {
		t.Errorf("events %q, want one naming a's replaced source", got)
	}
}

// fakeKubelets answers CheckData per kubelet minor and records the calls.
type fakeKubelets struct {
	errs  map[string]error // by minor
	calls []string         // kubelet versions asked
}

func (f *fakeKubelets) CheckData(_ context.Context, kubeletVersion string, data []byte) (*configcheck.Checked, error) {
	f.calls = append(f.calls, kubeletVersion)
	if string(data) != goodConfig {
		return nil, fmt.Errorf("checked %q, want the ConfigMap key's content", data)
	}
	return &configcheck.Checked{}, f.errs[checkapi.Minor(kubeletVersion)]
}

// TestKubeletCheckBeforeAnyNode: the config is checked with the kubelet's code of every minor among the
// selected nodes before any node is assigned; a refusal sets ConfigInvalid ValidationFailed naming the
// minor and creates no revision, a check that cannot be made lets the nodes check it, and each outcome is
// kept: a second sync checks nothing again.
func TestKubeletCheckBeforeAnyNode(t *testing.T) {
	withVersion := func(n *corev1.Node, v string) *corev1.Node { n.Status.NodeInfo.KubeletVersion = v; return n }
	refused := fmt.Errorf("%w: invalid configuration: eventRecordQPS (--event-qps) -3 must not be a negative number", configcheck.ErrValidate)
	for _, tc := range []struct {
		name        string
		errs        map[string]error
		wantInvalid string // substring of ConfigInvalid's message; "" when the pool rolls out
		wantCalls   string // kubelet versions checked over two syncs; default each minor once, oldest first
	}{
		{name: "every minor accepts"},
		{name: "one minor refuses", errs: map[string]error{"1.37": refused},
			wantInvalid: `key "kubelet": the kubelet 1.37 refuses it (2 selected nodes run it; checked with kubelet v1.37.1's code before any node is touched, ` +
				`without the nodes' flags and drop-ins: a feature gate the nodes enable by flag must be in the config's featureGates too): ` +
				`failed to validate config: invalid configuration: eventRecordQPS`},
		{name: "not loadable", errs: map[string]error{"1.36": fmt.Errorf("%w: strict decoding error", configcheck.ErrLoad)},
			wantInvalid: "the kubelet 1.36 refuses it (1 selected node runs it; checked with kubelet v1.36.4's code before", wantCalls: "v1.36.4"},
		{name: "no helper for a minor", errs: map[string]error{"1.36": fmt.Errorf("%w: kubelet v1.36.4 is not supported", configcheck.ErrUnsupportedKubelet)}},
		{name: "helper crashed", errs: map[string]error{"1.37": errors.New("run dkc-kubelet-check-1.37: signal: killed")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testPool(), configMap(map[string]string{"kubelet": goodConfig}),
				withVersion(node("a", nil, nil), "v1.36.4"), withVersion(node("b", nil, nil), "v1.37.1"),
				withVersion(node("c", nil, nil), "v1.37.2-eks-1"), node("d", nil, nil))
			kubelets := &fakeKubelets{errs: tc.errs}
			h.c.cfg.Kubelets, h.c.kubelets = kubelets, newKubeletChecks(kubelets, zap.NewNop(), h.clock)
			for range 2 {
				if _, err := h.c.sync(context.Background(), "blue"); err != nil {
					t.Fatal(err)
				}
			}
			if tc.wantCalls == "" {
				tc.wantCalls = "v1.36.4 v1.37.1"
			}
			if got := strings.Join(kubelets.calls, " "); got != tc.wantCalls {
				t.Errorf("checked with %q over two syncs, want %q (each minor once, oldest first, up to a refusal)", got, tc.wantCalls)
			}
			last := h.pools.updates[len(h.pools.updates)-1]
			c := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionConfigInvalid)
			if tc.wantInvalid == "" {
				if c == nil || c.Status != metav1.ConditionFalse || len(h.assigned()) == 0 {
					t.Errorf("ConfigInvalid %+v, assigned %v; want False and a node assigned", c, h.assigned())
				}
				return
			}
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonValidationFailed || !strings.Contains(c.Message, tc.wantInvalid) {
				t.Fatalf("ConfigInvalid %+v, want True ValidationFailed with %q", c, tc.wantInvalid)
			}
			// The content's revision, by which `kubectl dkc rollout` tells a finding on an edit from one before it.
			if rev := revision.Name("kube-system", "kubelet", map[string]string{"kubelet": goodConfig}); !strings.Contains(c.Message, "(revision "+rev+")") {
				t.Errorf("ConfigInvalid %q does not name revision %s", c.Message, rev)
			}
			if got := h.assigned(); len(got) != 0 {
				t.Errorf("assigned %v a config the kubelet refuses", got)
			}
			for _, a := range h.client.Actions() {
				if a.GetVerb() == "create" && a.GetResource().Resource == "configmaps" {
					t.Error("created a revision of a config the kubelet refuses")
				}
			}
		})
	}
}

// TestKubeletCheckOnlyForNewRevisions: the pool's current revision is not checked again (nodes of a minor
// that joined later check it themselves), and a check cut short by the sync's context decides nothing and
// keeps nothing.
func TestKubeletCheckOnlyForNewRevisions(t *testing.T) {
	cm := configMap(map[string]string{"kubelet": goodConfig})
	n := node("a", nil, nil)
	n.Status.NodeInfo.KubeletVersion = "v1.37.1"

	pool := testPool()
	pool.Status.CurrentRevision = revision.Name("kube-system", "kubelet", cm.Data)
	h := newHarness(t, pool, cm, n)
	kubelets := &fakeKubelets{errs: map[string]error{"1.37": fmt.Errorf("%w: refused", configcheck.ErrValidate)}}
	h.c.cfg.Kubelets, h.c.kubelets = kubelets, newKubeletChecks(kubelets, zap.NewNop(), h.clock)
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatal(err)
	}
	if len(kubelets.calls) != 0 || len(h.assigned()) != 1 {
		t.Errorf("current revision: checked with %v, assigned %v; want no check and node a assigned", kubelets.calls, h.assigned())
	}

	h = newHarness(t, testPool(), cm, n)
	h.c.cfg.Kubelets, h.c.kubelets = kubelets, newKubeletChecks(kubelets, zap.NewNop(), h.clock)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.c.sync(ctx, "blue"); !errors.Is(err, context.Canceled) {
		t.Errorf("sync with a cancelled context: %v, want context.Canceled", err)
	}
	if len(h.assigned()) != 0 || len(h.pools.updates) != 0 || len(h.c.kubelets.outcomes) != 0 {
		t.Errorf("a cancelled check assigned %v, wrote %d statuses, kept %v", h.assigned(), len(h.pools.updates), h.c.kubelets.outcomes)
	}
}

// TestKubeletCheckThatFailedIsMadeAgain: a check that could not be made (the helper crashed or timed out) is
// not kept for good: syncs within uncheckedRetry take its outcome, the first after it checks again (the
// revision's, and a running revision's for nodeChecks). A minor no helper speaks is not asked again.
func TestKubeletCheckThatFailedIsMadeAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		first     error
		wantCalls int // over three syncs, the last after uncheckedRetry
	}{
		{name: "helper crashed", first: errors.New("run dkc-kubelet-check-1.37: signal: killed"), wantCalls: 2},
		{name: "no helper for the minor", first: fmt.Errorf("%w: kubelet v1.37.1 is not supported", configcheck.ErrUnsupportedKubelet), wantCalls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := node("a", nil, nil)
			n.Status.NodeInfo.KubeletVersion = "v1.37.1"
			// Paused: nothing is assigned, so each sync decides on the revision again.
			pool := testPool()
			pool.Spec.Paused = true
			h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), n)
			kubelets := &fakeKubelets{errs: map[string]error{"1.37": tc.first}}
			h.c.cfg.Kubelets, h.c.kubelets = kubelets, newKubeletChecks(kubelets, zap.NewNop(), h.clock)
			sync := func() {
				t.Helper()
				if _, err := h.c.sync(context.Background(), "blue"); err != nil {
					t.Fatal(err)
				}
			}
			sync()
			h.clock.Step(uncheckedRetry / 2)
			sync()
			h.clock.Step(uncheckedRetry)
			sync()
			if len(kubelets.calls) != tc.wantCalls {
				t.Errorf("helper asked %d times over three syncs, want %d", len(kubelets.calls), tc.wantCalls)
			}
		})
	}
}
