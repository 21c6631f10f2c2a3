// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// PodDisruptionBudget-aware batches (plan.Budgets): a 1.34 kubelet's restart sets every container with a
// readiness or startup probe not Ready until the probe passes again (kubernetes#100277; from 1.35 the
// kubelet keeps the containers' readiness across its restart, KEP-4781), so restarting the kubelets of
// two nodes at once can take a Deployment behind a PodDisruptionBudget below what the budget allows,
// though no pod is evicted and the Eviction API is never asked. A batch therefore picks such nodes only
// while the budgets of their Ready probed pods allow it.
//
// The budgets come from an informer (a cluster holds few, and they are small); the pods are read only for
// the nodes a decision weighs — those restarting now and the batch's candidates, and only when some
// budget exists and the node's kubelet loses readiness on a restart — and for each budget weighed, its
// pods (by its selector, in its namespace), from the apiserver's watch cache. A budget's room is
// computed from those pods rather than read from status.disruptionsAllowed: the disruption controller
// writes that a moment after a pod loses its readiness, and a batch decided in that moment would count
// the pod twice over — not at all as lost, and as about to be.

// firstMinorKeepingReadiness is the first kubelet minor whose restart keeps its pods' readiness.
const firstMinorKeepingReadiness = 35

// restartCostsReadiness says whether a restart of the node's kubelet sets its pods' probed containers not
// Ready: kubelets before 1.35, and a kubelet whose version cannot be read.
func restartCostsReadiness(n *corev1.Node) bool {
	major, minor, ok := strings.Cut(checkapi.Minor(n.Status.NodeInfo.KubeletVersion), ".")
	if !ok || major != "1" {
		return true
	}
	m, err := strconv.Atoi(minor)
	return err != nil || m < firstMinorKeepingReadiness
}

// probed says whether a pod has a container (a sidecar — a restartable init container — included) whose
// readiness depends on a probe: a readiness or a startup probe. A container without one is Ready as soon
// as the restarted kubelet sees it running.
func probed(p *corev1.Pod) bool {
	for _, c := range p.Spec.Containers {
		if c.ReadinessProbe != nil || c.StartupProbe != nil {
			return true
		}
	}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways &&
			(c.ReadinessProbe != nil || c.StartupProbe != nil) {
			return true
		}
	}
	return false
}

// losesReadiness says whether a restart of its node's kubelet (one that loses readiness) takes the pod
// from Ready: it runs, and has a probe its readiness depends on.
func losesReadiness(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && probed(p)
}

// healthy says whether the disruption controller counts the pod among its budget's healthy pods: Ready,
// not being deleted, and not being evicted (status.disruptedPods).
func healthy(p *corev1.Pod, pdb *policyv1.PodDisruptionBudget) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	if _, evicting := pdb.Status.DisruptedPods[p.Name]; evicting {
		return false
	}
	ready, _ := readiness(p)
	return ready
}

// podReads are the pods of the nodes one decision reads, each node's read once.
type podReads struct {
	ctx context.Context
	c   *Controller
	m   map[string][]corev1.Pod
}

func (c *Controller) newPodReads(ctx context.Context) *podReads {
	return &podReads{ctx: ctx, c: c, m: map[string][]corev1.Pod{}}
}

func (r *podReads) of(node string) ([]corev1.Pod, error) {
	if pods, ok := r.m[node]; ok {
		return pods, nil
	}
	pods, err := r.c.nodePods(r.ctx, node)
	if err != nil {
		return nil, err
	}
	r.m[node] = pods
	return pods, nil
}

// budgetView is the cluster's PodDisruptionBudgets for one decision (plan.Budgets). Every read is made
// once; the first that fails is kept in err, and the decision is then discarded (plan.Budgets cannot
// fail: a node whose pods could not be read would look free).
type budgetView struct {
	c     *Controller
	ctx   context.Context
	nodes map[string]*corev1.Node
	pods  *podReads
	room  map[string]int
	takes map[string]map[string]int
	// elsewhere: restartingElsewhere's answers, by node.
	elsewhere map[string]bool
	err       error
}

// budgets is the view of the PodDisruptionBudgets for a decision over the selected nodes, or nil when
// none can hold a batch back: no budget exists, or no selected node's kubelet restart costs readiness.
func (c *Controller) budgets(ctx context.Context, nodes map[string]*corev1.Node, pods *podReads) (*budgetView, error) {
	if c.pdbList == nil {
		return nil, nil
	}
	all, err := c.pdbList.List(labels.Everything())
	if err != nil || len(all) == 0 {
		return nil, err
	}
	for _, n := range nodes {
		if restartCostsReadiness(n) {
			return &budgetView{c: c, ctx: ctx, nodes: nodes, pods: pods, room: map[string]int{},
				takes: map[string]map[string]int{}, elsewhere: map[string]bool{}}, nil
		}
	}
	return nil, nil
}

func (b *budgetView) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

// Takes is how many pods of each budget a restart of node's kubelet takes from Ready: its healthy pods
// with a probe, when its kubelet loses readiness on a restart.
func (b *budgetView) Takes(node string) map[string]int {
	if t, ok := b.takes[node]; ok {
		return t
	}
	var out map[string]int
	if n := b.nodes[node]; n != nil && restartCostsReadiness(n) {
		pods, err := b.pods.of(node)
		if err != nil {
			b.fail(err)
		}
		for i := range pods {
			p := &pods[i]
			if !losesReadiness(p) {
				continue
			}
			pdbs, err := b.c.pdbList.GetPodPodDisruptionBudgets(p)
			if err != nil { // none selects it
				continue
			}
			for _, pdb := range pdbs {
				if healthy(p, pdb) {
					if out == nil {
						out = map[string]int{}
					}
					out[pdb.Namespace+"/"+pdb.Name]++
				}
			}
		}
	}
	b.takes[node] = out
	return out
}

// Allowed is how many more of the budget's pods may stop being Ready now: its healthy pods less
// status.desiredHealthy, less its healthy probed pods on nodes outside the pool whose kubelet restarts or
// may restart now (another pool's, or one assigned by hand: the plan counts only the pool's own). The
// healthy pods are the fewer of those read now and status.currentHealthy: whichever lags (a pod that just
// lost its readiness, a scale-up the disruption controller has not counted), the smaller is the cautious
// one. None while the disruption controller has not observed the budget's spec, could not compute it, or
// expects no pods (it allows nothing then, as the Eviction API refuses).
func (b *budgetView) Allowed(budget string) int {
	if v, ok := b.room[budget]; ok {
		return v
	}
	v := 0
	if pdb := b.budget(budget); pdb != nil && pdb.Status.ExpectedPods > 0 {
		pods, err := b.healthyPods(pdb)
		if err != nil {
			b.fail(err)
		}
		elsewhere := 0
		for _, p := range pods {
			if losesReadiness(p) && b.restartingElsewhere(p.Spec.NodeName) {
				elsewhere++
			}
		}
		v = min(len(pods), int(pdb.Status.CurrentHealthy)) - int(pdb.Status.DesiredHealthy) - elsewhere
	}
	b.room[budget] = v
	return v
}

// restartingElsewhere says whether node is outside the pool and its kubelet, one that loses its pods'
// readiness on a restart, restarts or may restart now: another pool of this controller assigned it a
// moment ago (expectations), or its status shows it has yet to apply its source or is not settled on it
// (plan.Unsettled).
func (b *budgetView) restartingElsewhere(node string) bool {
	if _, mine := b.nodes[node]; mine || node == "" {
		return false
	}
	if r, ok := b.elsewhere[node]; ok {
		return r
	}
	r := false
	if n, err := b.c.nodes.Get(node); err == nil && restartCostsReadiness(n) {
		src, _, srcErr := resolve.NodeSource(n, b.c.cfg.Namespaces)
		r = b.c.exp.assignedAnywhere(node, b.c.clock.Now()) || srcErr == nil && plan.Unsettled(src, statusOf(n))
	}
	b.elsewhere[node] = r
	return r
}

// Most is what the budget allows with every pod it expects healthy: status.expectedPods less
// status.desiredHealthy (none when Allowed says none for the budget's status).
func (b *budgetView) Most(budget string) int {
	if pdb := b.budget(budget); pdb != nil {
		return int(pdb.Status.ExpectedPods - pdb.Status.DesiredHealthy)
	}
	return 0
}

// budget is the named budget when its status can be read: observed by the disruption controller at its
// current spec, and computed.
func (b *budgetView) budget(name string) *policyv1.PodDisruptionBudget {
	ns, n, _ := strings.Cut(name, "/")
	pdb, err := b.c.pdbList.PodDisruptionBudgets(ns).Get(n)
	if err != nil || pdb.Status.ObservedGeneration < pdb.Generation || syncFailed(pdb) {
		return nil
	}
	return pdb
}

// healthyPods are the budget's healthy pods, listed by its selector from the watch cache.
func (b *budgetView) healthyPods(pdb *policyv1.PodDisruptionBudget) ([]*corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		return nil, nil // selects nothing, as the disruption controller reads it
	}
	list, err := b.c.cfg.Client.CoreV1().Pods(pdb.Namespace).List(b.ctx, metav1.ListOptions{
		LabelSelector: sel.String(), ResourceVersion: "0",
	})
	if err != nil {
		return nil, fmt.Errorf("list pods of poddisruptionbudget %s/%s: %w", pdb.Namespace, pdb.Name, err)
	}
	var out []*corev1.Pod
	for i := range list.Items {
		if p := &list.Items[i]; sel.Matches(labels.Set(p.Labels)) && healthy(p, pdb) {
			out = append(out, p)
		}
	}
	return out, nil
}

// syncFailed says whether the disruption controller could not compute the budget (its DisruptionAllowed
// condition False with reason SyncFailed: a selector over pods without a controller and maxUnavailable,
// say); its desiredHealthy says nothing then.
func syncFailed(pdb *policyv1.PodDisruptionBudget) bool {
	c := meta.FindStatusCondition(pdb.Status.Conditions, policyv1.DisruptionAllowedCondition)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == policyv1.SyncFailedReason
}

var _ plan.Budgets = (*budgetView)(nil)
