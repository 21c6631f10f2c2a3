// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

func TestRestartCostsReadiness(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    bool
	}{
		{"v1.34.4", true}, {"v1.35.0", false}, {"v1.37.2", false}, {"v1.36.0-rc.1", false},
		{"v1.34.0+k3s1", true}, {"", true}, {"v2.0.0", true},
	} {
		n := &corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: tc.version}}}
		if got := restartCostsReadiness(n); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.version, got, tc.want)
		}
	}
}

func TestProbed(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	probe := &corev1.Probe{}
	for _, tc := range []struct {
		name string
		spec corev1.PodSpec
		want bool
	}{
		{"no probe", corev1.PodSpec{Containers: []corev1.Container{{}}}, false},
		{"a liveness probe only", corev1.PodSpec{Containers: []corev1.Container{{LivenessProbe: probe}}}, false},
		{"a readiness probe", corev1.PodSpec{Containers: []corev1.Container{{}, {ReadinessProbe: probe}}}, true},
		{"a startup probe", corev1.PodSpec{Containers: []corev1.Container{{StartupProbe: probe}}}, true},
		{"a sidecar's readiness probe", corev1.PodSpec{Containers: []corev1.Container{{}},
			InitContainers: []corev1.Container{{RestartPolicy: &always, ReadinessProbe: probe}}}, true},
		{"an init container's probe does not count", corev1.PodSpec{Containers: []corev1.Container{{}},
			InitContainers: []corev1.Container{{StartupProbe: probe}}}, false},
	} {
		if got := probed(&corev1.Pod{Spec: tc.spec}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBatchesKeepPodDisruptionBudgets: three nodes, each running one Ready pod of a Deployment whose
// PodDisruptionBudget allows one pod not Ready (minAvailable 2 of 3); a and b run 1.34 kubelets, whose
// restart costs the pods their readiness, c a 1.37 one. With room for all three in maxUnavailable, the
// first batch is a and c (b would take the budget below what it allows); b waits while a is in progress —
// also once a's pod lost its readiness and the budget's status does not show it yet — and is assigned
// once a is through and its pod Ready again.
func TestBatchesKeepPodDisruptionBudgets(t *testing.T) {
	ctx := context.Background()
	pool := testPool()
	all := intstr.FromInt32(3)
	pool.Spec.MaxUnavailable = &all
	kubelet := func(n *corev1.Node, v string) *corev1.Node { n.Status.NodeInfo.KubeletVersion = v; return n }
	h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}),
		kubelet(node("a", nil, nil), "v1.34.4"), kubelet(node("b", nil, nil), "v1.34.4"),
		kubelet(node("c", nil, nil), "v1.37.2"))
	t0 := h.clock.Now()
	web := func(name, node string) *corev1.Pod {
		p := workload(name, node, t0.Add(-time.Hour), readyAt(true, t0.Add(-time.Hour)))
		p.Labels = map[string]string{"app": "web"}
		p.Spec.Containers = []corev1.Container{{Name: "web", ReadinessProbe: &corev1.Probe{}}}
		return p
	}
	pods := map[string]*corev1.Pod{"a": web("web-a", "a"), "b": web("web-b", "b"), "c": web("web-c", "c")}
	for _, p := range pods {
		if _, err := h.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	two := intstr.FromInt32(2)
	// As the disruption controller leaves it before any restart: 3 healthy, 2 desired, 1 allowed.
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &two,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
		Status: policyv1.PodDisruptionBudgetStatus{CurrentHealthy: 3, DesiredHealthy: 2, DisruptionsAllowed: 1,
			ExpectedPods: 3}}
	if err := h.c.pdbs.GetStore().Add(pdb); err != nil {
		t.Fatal(err)
	}
	sync := func() (time.Duration, metav1.Condition) {
		t.Helper()
		after, err := h.c.sync(ctx, "blue")
		if err != nil {
			t.Fatal(err)
		}
		last := h.pools.updates[len(h.pools.updates)-1]
		if err := h.c.pools.GetStore().Update(last); err != nil {
			t.Fatal(err)
		}
		return after, ptr.Deref(meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionUpdating), metav1.Condition{})
	}
	setReady := func(node string, ready bool) {
		t.Helper()
		p := pods[node]
		p.Status.Conditions = nil
		readyAt(ready, h.clock.Now())(p)
		if _, err := h.client.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	after, updating := sync()
	if got := strings.Join(h.assigned(), ","); got != "a,c" {
		t.Fatalf("first batch %s, want a,c (b would take default/web below minAvailable)", got)
	}
	if want := "node b: PodDisruptionBudget default/web allows 0 more not Ready, its restart takes 1"; !strings.Contains(updating.Message, want) {
		t.Errorf("Updating %q, want one naming %q", updating.Message, want)
	}
	if after <= 0 || after > 5*time.Second {
		t.Errorf("requeue after %v, want a poll of at most 5s (a budget moves with pods the pool does not watch)", after)
	}

	// a and c in progress, a's pod still Ready (its kubelet not restarted yet): b waits.
	h.clock.Step(5 * time.Second)
	_, updating = sync()
	if got := strings.Join(h.assigned(), ","); got != "a,c" || updating.Reason != v1alpha1.ReasonWaitingForDisruptionBudget {
		t.Fatalf("assigned %s, Updating %s %q; want a,c and WaitingForDisruptionBudget", got, updating.Reason, updating.Message)
	}

	// a's kubelet restarted: its pod is not Ready, and the budget's status still says 1 allowed.
	h.clock.Step(5 * time.Second)
	setReady("a", false)
	sync()
	if got := strings.Join(h.assigned(), ","); got != "a,c" {
		t.Fatalf("assigned %s while a's pod is not Ready, want a,c", got)
	}

	// a and c run the revision, a's pod is Ready again: a is through, b goes.
	h.clock.Step(5 * time.Second)
	setReady("a", true)
	last := h.pools.updates[len(h.pools.updates)-1]
	proveOn(t, h, "a", last.Status.CurrentRevision)
	proveOn(t, h, "c", last.Status.CurrentRevision)
	sync()
	if got := strings.Join(h.assigned(), ","); got != "a,c,b" {
		t.Fatalf("assigned %s once a is through, want a,c,b", got)
	}
}

// TestBudgetsHoldWhatTheyCannotRead: two 1.34 nodes each running a Ready probed pod of a budget that
// allows one not Ready (minAvailable 1 of 2): a is assigned, b held. Each row changes one thing: a budget
// the disruption controller has not observed at its spec, could not compute, or expects no pods of allows
// nothing; so does one whose pod on a node of another pool is about to restart; a pod being evicted is not
// healthy (a waits, b takes nothing); a pod read that fails fails the sync rather than let a node through.
func TestBudgetsHoldWhatTheyCannotRead(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		pdb  func(*policyv1.PodDisruptionBudget)
		// x, of another pool, runs a pod of the budget: "unsettled" (a source its sidecar has not applied
		// yet), "expected" (another pool assigned it a moment ago), "expired" (that long ago), "" (no x).
		x        string
		failList bool
		assigned string
		err      string
	}{
		{name: "room for one: a", assigned: "a"},
		{name: "not observed at its spec yet: nothing", pdb: func(p *policyv1.PodDisruptionBudget) {
			p.Generation, p.Status.ObservedGeneration = 2, 1
		}},
		{name: "not computed (SyncFailed): nothing", pdb: func(p *policyv1.PodDisruptionBudget) {
			p.Status.Conditions = []metav1.Condition{{Type: policyv1.DisruptionAllowedCondition,
				Status: metav1.ConditionFalse, Reason: policyv1.SyncFailedReason}}
		}},
		{name: "expects no pods: nothing", pdb: func(p *policyv1.PodDisruptionBudget) { p.Status.ExpectedPods = 0 }},
		{name: "a pod being evicted is not healthy: a waits, b (whose pod it is) takes nothing",
			pdb: func(p *policyv1.PodDisruptionBudget) {
				p.Status.DisruptedPods = map[string]metav1.Time{"web-b": {Time: now}}
			}, assigned: "b"},
		{name: "another pool's node about to restart its pod: nothing", x: "unsettled"},
		{name: "another pool assigned a node with its pod a moment ago: nothing", x: "expected"},
		{name: "an assignment of another pool's never confirmed, expired: a", x: "expired", assigned: "a"},
		{name: "the budget's status counts a pod fewer than read (it lags a loss): nothing",
			pdb: func(p *policyv1.PodDisruptionBudget) { p.Status.CurrentHealthy = 1 }},
		{name: "a pod read that fails: the sync fails, nothing", failList: true, err: "list pods of node a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool := testPool()
			all := intstr.FromInt32(2)
			pool.Spec.MaxUnavailable = &all
			on134 := func(n *corev1.Node) *corev1.Node { n.Status.NodeInfo.KubeletVersion = "v1.34.4"; return n }
			nodes := []*corev1.Node{on134(node("a", nil, nil)), on134(node("b", nil, nil))}
			pods := []*corev1.Pod{}
			web := func(name, node string) *corev1.Pod {
				p := workload(name, node, now.Add(-time.Hour), readyAt(true, now.Add(-time.Hour)))
				p.Labels = map[string]string{"app": "web"}
				p.Spec.Containers = []corev1.Container{{Name: "web", ReadinessProbe: &corev1.Probe{}}}
				return p
			}
			pods = append(pods, web("web-a", "a"), web("web-b", "b"))
			expected := int32(2)
			if tc.x != "" {
				annotations := map[string]string{}
				if tc.x == "unsettled" {
					annotations[nodeconfig.SourceAnnotation] = sourceJSON(corev1.ConfigMapNodeConfigSource{
						Namespace: "kube-system", Name: "by-hand", KubeletConfigKey: "kubelet"})
				}
				nodes = append(nodes, on134(node("x", annotations, map[string]string{"pool": "green"})))
				pods = append(pods, web("web-x", "x"))
				expected = 3
			}
			h := newHarness(t, pool, configMap(map[string]string{"kubelet": goodConfig}), nodes...)
			switch tc.x {
			case "expected":
				h.c.exp.expect("green", "x", v1alpha1.Assignment{Pool: "green", Revision: "r1"}, h.clock.Now())
			case "expired":
				h.c.exp.expect("green", "x", v1alpha1.Assignment{Pool: "green", Revision: "r1"},
					h.clock.Now().Add(-expectationTTL-time.Second))
			}
			for _, p := range pods {
				if _, err := h.client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.failList {
				h.client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("etcdserver: request timed out")
				})
			}
			one := intstr.FromInt32(expected - 1)
			pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
				Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one,
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
				Status: policyv1.PodDisruptionBudgetStatus{CurrentHealthy: expected, DesiredHealthy: expected - 1,
					DisruptionsAllowed: 1, ExpectedPods: expected}}
			if tc.pdb != nil {
				tc.pdb(pdb)
			}
			if err := h.c.pdbs.GetStore().Add(pdb); err != nil {
				t.Fatal(err)
			}
			_, err := h.c.sync(ctx, "blue")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("sync: %v, want an error with %q", err, tc.err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(h.assigned(), ","); got != tc.assigned {
				t.Errorf("assigned %q, want %q", got, tc.assigned)
			}
		})
	}
}

// TestForbiddenBudgetsAreLogged: with a ClusterRole that predates the budgets (no list on
// poddisruptionbudgets), the informer Run waits for never syncs; the controller says why, naming the fix.
func TestForbiddenBudgetsAreLogged(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	client := fake.NewClientset()
	client.PrependReactor("list", "poddisruptionbudgets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "policy", Resource: "poddisruptionbudgets"},
			"", errors.New("RBAC: access denied"))
	})
	c := New(Config{Log: zap.New(core), Client: client, Pools: newFakePools(),
		Nodes: informers.NewSharedInformerFactory(client, 0).Core().V1().Nodes(), Namespaces: resolve.NewNamespaces("kube-system"),
		ConfigMaps: func(func(string)) ConfigMaps { return &fakeConfigMaps{} }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.pdbs.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	poll.For(t, 10*time.Second, 20*time.Millisecond, "the forbidden list logged", func() bool {
		return logs.FilterMessageSnippet("grants list and watch on poddisruptionbudgets").Len() > 0
	})
	if c.pdbs.HasSynced() {
		t.Error("the informer synced without a list")
	}
}
