// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// TestPoolKeepsPodDisruptionBudgets: a PodDisruptionBudget with minAvailable 2 over three pods — a probed
// pod on each node, and on node-2 a pod whose readiness probe never passes — allows no pod to lose its
// readiness. A pool over both nodes with room for both (maxUnavailable 2) restarts node-2's 1.37 kubelet,
// which keeps its pods' readiness, and holds node-1's 1.34 kubelet, whose restart would take its pod from
// Ready (Updating WaitingForDisruptionBudget, naming node, budget and counts); node-1's kubelet does not
// restart while the budget allows nothing. Relaxed to minAvailable 1, node-1 goes, and its pod does lose
// its readiness — the disruption the budget held back. A watch on the pods, sampled every second, never
// sees the budget's healthy pods below its minAvailable of the moment.
func TestPoolKeepsPodDisruptionBudgets(t *testing.T) {
	resetAfter(t)
	const pool, ns, qps = "installed-budget", "budget", 43
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := admin(t)
	createConfig(t, pool, "node-1", qps)

	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	app := map[string]string{"app": "budget"}
	grace := int64(1)
	spec := func(node string, ready []string) corev1.PodSpec {
		return corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			Containers: []corev1.Container{{Name: "app", Image: devcluster.ImageRepo + "/pause:" + devcluster.ImageTag,
				ReadinessProbe: &corev1.Probe{
					ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: ready}},
					// As TestPoolWaitsForPodsReadyAgain's: Ready again a minute after a 1.34 kubelet's restart,
					// long enough that the loss reaches the API.
					PeriodSeconds: 10, SuccessThreshold: 6, TimeoutSeconds: 5,
				}}},
			Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane",
				Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		}
	}
	for _, n := range nodes {
		labels := map[string]string{"app": "budget", "node": n}
		if _, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "on-" + n},
			Spec: appsv1.DeploymentSpec{Replicas: new(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: spec(n, []string{"/pause", "-v"})}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The pod that holds the budget at its limit: its probe runs a command that does not exist.
	if _, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "never-ready", Labels: map[string]string{"app": "budget", "role": "blocker"}},
		Spec:       spec("node-2", []string{"/never-ready"}),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "budget"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromInt32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: app}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	w := newReadinessWatch(ctx, t, ns)
	// Each node's probed pod Ready, the blocker running and not Ready, and the budget computed on them.
	poll.ForNil(t, 3*time.Minute, time.Second, "both probed pods Ready, the budget at 2 healthy of 3", func() error {
		if notReady := w.notReadyNodes(); len(notReady) > 0 {
			return fmt.Errorf("no Ready pod on %v", notReady)
		}
		pdb, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "budget", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s := pdb.Status; s.ExpectedPods != 3 || s.CurrentHealthy != 2 || s.DesiredHealthy != 2 || s.DisruptionsAllowed != 0 {
			return fmt.Errorf("budget status expected %d, healthy %d, desired %d, allowed %d", s.ExpectedPods,
				s.CurrentHealthy, s.DesiredHealthy, s.DisruptionsAllowed)
		}
		return nil
	})
	w.start()
	minHealthy := newHealthyWatch(w)
	minHealthy.start()
	defer minHealthy.stop()

	since := time.Now()
	applyPool(t, pool, "  maxUnavailable: 2\n")

	// node-2 goes, node-1 waits for the budget.
	want := "node node-1: PodDisruptionBudget " + ns + "/budget allows 0 more not Ready, its restart takes 1"
	var held string
	poll.ForNil(t, 5*time.Minute, time.Second, "node-2 updated, node-1 held by the budget", func() error {
		p, err := cluster.KubeletConfigPool(ctx, pool)
		if err != nil {
			return err
		}
		u := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionUpdating)
		if u == nil || u.Reason != v1alpha1.ReasonWaitingForDisruptionBudget || !strings.Contains(u.Message, want) ||
			p.Status.Nodes.Updated != 1 {
			return fmt.Errorf("updated %d, Updating %+v", p.Status.Nodes.Updated, u)
		}
		held = u.Message
		return nil
	})
	t.Logf("the pool said: %s", held)
	if got := configzQPS(t, "node-2"); got != qps {
		t.Errorf("node-2: configz eventRecordQPS %v, want %d", got, qps)
	}
	if s := startsSince(t, "node-1", since); len(s) != 0 {
		t.Fatalf("node-1's kubelet restarted at %v while its budget allowed no pod to lose readiness", s)
	}
	if low := minHealthy.low(); low < 2 {
		t.Errorf("the budget's healthy pods fell to %d while it asked for 2", low)
	}

	// Relaxed: node-1 goes, and its restart costs its pod the readiness the budget was keeping.
	relaxed := time.Now()
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).Patch(ctx, "budget", types.MergePatchType,
		[]byte(`{"spec":{"minAvailable":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := kubectlDKC(ctx, "rollout", "status", pool, "--timeout", "5m")
	if err != nil || !strings.Contains(out, "rollout complete: 2 nodes run revision") {
		t.Fatalf("kubectl dkc rollout status: %v\n%s", err, out)
	}
	minHealthy.stop()
	lowRelaxed := minHealthy.low()
	samples := w.stop()
	s := startsSince(t, "node-1", relaxed)
	if len(s) != 1 {
		t.Fatalf("node-1: kubelet started %d times (%v) after the budget was relaxed, want once", len(s), s)
	}
	if got := configzQPS(t, "node-1"); got != qps {
		t.Errorf("node-1: configz eventRecordQPS %v, want %d", got, qps)
	}
	lost, back := samples.notReadyAfter("node-1", s[0])
	if lost.IsZero() {
		t.Errorf("node-1's pod stayed Ready through its 1.34 kubelet's restart at %s: nothing shows the budget held a "+
			"real disruption back", s[0].Format(time.TimeOnly))
	} else {
		t.Logf("node-1's kubelet restarted at %s; its pod not Ready from %s to %s", s[0].Format(time.TimeOnly),
			lost.Format(time.TimeOnly), back.Format(time.TimeOnly))
	}
	if lowRelaxed < 1 {
		t.Errorf("the budget's healthy pods fell to %d after it was relaxed to minAvailable 1", lowRelaxed)
	}
}

// healthyWatch samples, every second, how many pods of a readiness watch are Ready (the budget's healthy
// pods), and keeps the lowest count since it was last read.
type healthyWatch struct {
	w    *readinessWatch
	mu   sync.Mutex
	min  int
	quit chan struct{}
	done chan struct{}
}

func newHealthyWatch(w *readinessWatch) *healthyWatch {
	return &healthyWatch{w: w, min: -1, quit: make(chan struct{}), done: make(chan struct{})}
}

func (h *healthyWatch) start() {
	go func() {
		defer close(h.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			n := 0
			for _, p := range h.w.pods() {
				if p.DeletionTimestamp == nil && podReady(p) {
					n++
				}
			}
			h.mu.Lock()
			if h.min < 0 || n < h.min {
				h.min = n
			}
			h.mu.Unlock()
			select {
			case <-tick.C:
			case <-h.quit:
				return
			}
		}
	}()
}

// low is the lowest count since the last call; the next call starts afresh.
func (h *healthyWatch) low() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.min
	h.min = -1
	return m
}

func (h *healthyWatch) stop() {
	select {
	case <-h.quit:
	default:
		close(h.quit)
	}
	<-h.done
}
