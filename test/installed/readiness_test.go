// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/cli/plugin"
	"github.com/dkc-dev/dkc/internal/poll"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// TestPoolWaitsForPodsReadyAgain: a pool over the 1.34 and the 1.37 node, each running one pod of a
// Deployment behind a PodDisruptionBudget (minAvailable = replicas - 1), whose readiness probe needs six
// passes ten seconds apart. The 1.34 kubelet's restart sets its pod not Ready for at least 50 s
// (kubernetes#100277), longer than the sidecar's 20 s trial: the pool keeps that node in progress
// (Updating reason WaitingForPods) until the pod is Ready again, and only then restarts the other node's
// kubelet. A watch on the pods, sampled every second, never sees both nodes' pods not Ready at once.
// (Without the gate the second kubelet restarts once the trial ends, while the first pod is still not
// Ready.)
func TestPoolWaitsForPodsReadyAgain(t *testing.T) {
	resetAfter(t)
	const pool, ns = "installed-readiness", "readiness"
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	c := admin(t)
	createConfig(t, pool, "node-1", 47)

	// The workload: one pod per node, Ready once its probe passed four times.
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	app := map[string]string{"app": "probed"}
	grace := int64(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "probed", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(len(nodes))), Selector: &metav1.LabelSelector{MatchLabels: app},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: app},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{Name: "probed",
						Image: devcluster.ImageRepo + "/pause:" + devcluster.ImageTag,
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/pause", "-v"}}},
							PeriodSeconds: 10, SuccessThreshold: 6, TimeoutSeconds: 5,
						}}},
					Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane",
						Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: app},
							TopologyKey:   corev1.LabelHostname}}}},
				},
			},
		},
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "probed", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: new(intstr.FromInt32(int32(len(nodes) - 1))),
			Selector: &metav1.LabelSelector{MatchLabels: app}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The sampler: the pods through a watch, looked at every second.
	w := newReadinessWatch(ctx, t, ns)
	poll.ForNil(t, 3*time.Minute, time.Second, "a Ready pod of the Deployment on every node", func() error {
		if notReady := w.notReadyNodes(); len(notReady) > 0 {
			return fmt.Errorf("not Ready on %v", notReady)
		}
		return nil
	})
	w.start()

	// The pool, over both nodes, one at a time.
	since := time.Now()
	applyPool(t, pool, "  maxUnavailable: 1\n")
	sawWaiting := make(chan string, 1)
	go func() { // the pool's reason, looked at as often as the pods
		for ctx.Err() == nil {
			if p, err := cluster.KubeletConfigPool(ctx, pool); err == nil {
				if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionUpdating); c != nil &&
					c.Reason == v1alpha1.ReasonWaitingForPods {
					sawWaiting <- c.Message
					return
				}
			}
			time.Sleep(time.Second) // paces the look at the pool's status, which no watch here follows
		}
	}()
	out, err := kubectlDKC(ctx, "rollout", "status", pool, "--timeout", "8m")
	if err != nil || !strings.Contains(out, "rollout complete: 2 nodes run revision") {
		t.Fatalf("kubectl dkc rollout status: %v\n%s", err, out)
	}
	samples := w.stop()
	for _, n := range nodes {
		if got := configzQPS(t, n); got != 47 {
			t.Errorf("%s: configz eventRecordQPS %v, want 47", n, got)
		}
	}

	// The order the kubelets restarted in, and what each restart cost its pod.
	type restart struct {
		node, version  string
		at, readyAgain time.Time
	}
	var restarts []restart
	for _, n := range nodes {
		s := startsSince(t, n, since)
		if len(s) != 1 {
			t.Fatalf("%s: kubelet started %d times (%v), want once", n, len(s), s)
		}
		node, err := c.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r := restart{node: n, version: node.Status.NodeInfo.KubeletVersion, at: s[0]}
		switch lost, back := samples.notReadyAfter(n, s[0]); {
		case lost.IsZero():
			t.Logf("%s (kubelet %s) restarted at %s; its pod stayed Ready", n, r.version, s[0].Format(time.TimeOnly))
		case back.IsZero():
			t.Fatalf("%s (kubelet %s) restarted at %s; its pod lost readiness at %s and was not Ready again when "+
				"the rollout completed", n, r.version, s[0].Format(time.TimeOnly), lost.Format(time.TimeOnly))
		default:
			r.readyAgain = back
			t.Logf("%s (kubelet %s) restarted at %s; its pod not Ready from %s to %s", n, r.version,
				s[0].Format(time.TimeOnly), lost.Format(time.TimeOnly), back.Format(time.TimeOnly))
		}
		restarts = append(restarts, r)
	}
	slices.SortFunc(restarts, func(a, b restart) int { return a.at.Compare(b.at) })
	first, second := restarts[0], restarts[1]
	if first.readyAgain.IsZero() {
		t.Fatalf("%s (kubelet %s) restarted first and its pod stayed Ready: nothing here shows the gate (the 1.34 "+
			"kubelet's restart must cost readiness)", first.node, first.version)
	}
	if second.at.Before(first.readyAgain.Add(-time.Second)) { // a sample is a second long
		t.Errorf("%s's kubelet restarted at %s, before %s's pod was Ready again at %s: the pool moved on while a "+
			"node's pods were not Ready", second.node, second.at.Format(time.TimeOnly), first.node,
			first.readyAgain.Format(time.TimeOnly))
	}
	if both := samples.bothNotReady(); len(both) > 0 {
		t.Errorf("both nodes' pods not Ready at once at %d samples, first %s", len(both), both[0].Format(time.TimeOnly))
	}
	select {
	case msg := <-sawWaiting:
		t.Logf("the pool said: %s", msg)
	default:
		t.Errorf("the pool never said %s", v1alpha1.ReasonWaitingForPods)
	}
}

// readinessWatch follows a namespace's pods through an informer and samples, every second, which nodes
// have a pod that is not Ready.
type readinessWatch struct {
	pods   func() []*corev1.Pod
	cancel context.CancelFunc
	quit   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	taken  samples
}

type sample struct {
	at       time.Time
	notReady []string // nodes
}

type samples []sample

func newReadinessWatch(ctx context.Context, t *testing.T, ns string) *readinessWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactoryWithOptions(admin(t), 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods()
	lister := inf.Lister()
	inf.Informer()
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("pod watch of %s: %v not synced", ns, typ)
		}
	}
	return &readinessWatch{cancel: cancel, quit: make(chan struct{}), done: make(chan struct{}),
		pods: func() []*corev1.Pod {
			pods, _ := lister.List(labels.Everything())
			return pods
		}}
}

// notReadyNodes are the nodes without a Ready pod of the namespace (the pod gone counts as not Ready).
func (w *readinessWatch) notReadyNodes() []string {
	ready := map[string]bool{}
	for _, p := range w.pods() {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && podReady(p) {
			ready[p.Spec.NodeName] = true
		}
	}
	var out []string
	for _, n := range nodes {
		if !ready[n] {
			out = append(out, n)
		}
	}
	return out
}

// start samples every second until stop.
func (w *readinessWatch) start() {
	go func() {
		defer close(w.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			s := sample{at: time.Now(), notReady: w.notReadyNodes()}
			w.mu.Lock()
			w.taken = append(w.taken, s)
			w.mu.Unlock()
			select {
			case <-tick.C:
			case <-w.quit:
				return
			}
		}
	}()
}

// stop ends the sampling and the watch, and returns the samples.
func (w *readinessWatch) stop() samples {
	close(w.quit)
	<-w.done
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.taken
}

// notReadyAfter is the first stretch of samples after at in which node had no Ready pod: when it began
// (zero: never) and the first sample after it that had one again (zero: none did).
func (ss samples) notReadyAfter(node string, at time.Time) (lost, back time.Time) {
	for _, s := range ss {
		if s.at.Before(at) {
			continue
		}
		down := slices.Contains(s.notReady, node)
		switch {
		case down && lost.IsZero():
			lost = s.at
		case !down && !lost.IsZero():
			return lost, s.at
		}
	}
	return lost, time.Time{}
}

// bothNotReady are the samples in which every node had no Ready pod.
func (ss samples) bothNotReady() []time.Time {
	var out []time.Time
	for _, s := range ss {
		if len(s.notReady) >= len(nodes) {
			out = append(out, s.at)
		}
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestPoolRefusesAConfigThatFailsPods: a pool over the worker runs a revision; an in-place edit lowers
// maxPods below the pods running there. Its kubelet, restarted, would re-admit them oldest first and fail
// the newest (a Deployment's pod) with OutOfpods, so the pool refuses the revision before the node is
// touched (ConfigInvalid CapacityRefused, naming the node and the pod): the kubelet does not restart and
// the pod keeps running.
func TestPoolRefusesAConfigThatFailsPods(t *testing.T) {
	resetAfter(t)
	const pool = "installed-capacity"
	deletePoolAtEnd(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	worker := workerNode()
	web := webBehindABudget(ctx, t, "capacity", worker)
	cm := createConfig(t, pool, worker, 48)
	out, err := kubectlDKC(ctx, "rollout", pool, "--configmap", "kube-system/"+pool, "-l",
		corev1.LabelHostname+"="+worker, "--timeout", "5m")
	if err != nil || !strings.Contains(out, "rollout complete: 1 nodes run revision") {
		t.Fatalf("kubectl dkc rollout: %v\n%s", err, out)
	}

	// maxPods one below the pods the kubelet would admit again.
	live := livePods(ctx, t, worker)
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(nodeConfig(t, worker, 48)), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["maxPods"] = live - 1
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	editConfig(t, cm, string(raw))
	out, err = kubectlDKC(ctx, "rollout", pool, "--timeout", "1m")
	var stopped *plugin.ErrRolloutStopped
	want := []string{"node " + worker, web.Namespace + "/" + web.Name + " (pod ", "OutOfpods", "nothing is assigned"}
	if !errors.As(err, &stopped) || stopped.Reason != v1alpha1.ReasonCapacityRefused {
		t.Fatalf("rollout of maxPods %d below the %d pods on %s: %v, want ConfigInvalid %s\n%s", live-1, live, worker,
			err, v1alpha1.ReasonCapacityRefused, out)
	}
	for _, w := range want {
		if !strings.Contains(stopped.Message, w) {
			t.Errorf("CapacityRefused message lacks %q: %s", w, stopped.Message)
		}
	}
	t.Logf("refused before the node: %s", stopped.Message)
	if s := startsSince(t, worker, since); len(s) != 0 {
		t.Errorf("%s: kubelet started %v for a config that fails its pods", worker, s)
	}
	got, err := admin(t).CoreV1().Pods(web.Namespace).Get(ctx, web.Name, metav1.GetOptions{})
	if err != nil || got.Status.Phase != corev1.PodRunning || !podReady(got) {
		t.Errorf("pod %s/%s after the refusal: %v %+v, want Running and Ready", web.Namespace, web.Name, err, got.Status)
	}
}
