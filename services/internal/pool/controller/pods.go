// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
)

// The workload gate (spec.disruption.podReadinessTimeout): a node that runs the revision counts as in
// progress until the pods that ran there before it was assigned are Ready again, and a pod the kubelet
// failed or evicted since fails it (plan: ReasonPodsNotReady, FailurePodsFailed). A kubelet restart
// re-admits every running pod against the new allocatable (a smaller maxPods or a larger reservation
// fails the newest with OutOfpods, OutOfcpu, ...), and a 1.34 kubelet's restart sets every container not
// Ready until its readiness probe passes again (kubernetes#100277).
//
// The controller keeps no pod informer: a cluster's pods outnumber its Nodes by far, and only the few
// nodes in progress matter. It lists a node's pods (by spec.nodeName, from the apiserver's watch cache)
// while the node is assigned the target, within its nodeTimeout and not yet through the gate; once
// through, the node is remembered for the revision (gated) and not looked at again this term. What a
// pod went through is read from its status alone (the Ready condition's transition time), so a new
// leader judges a node as the last one did.

// podsGated remembers the nodes through the workload gate, by pool, then node: the revision they passed
// it with. And, for the nodes in it, the pods seen running (by UID): a pod the kubelet rejects when it
// re-admits it after a restart may carry no time of its failure (the rejection writes no condition), and
// having seen it running since the assignment is what blames the restart. And the pods that were not
// Ready when the node was assigned, until seen Ready: a kubelet restart writes their Ready condition
// anew, with a new transition time, which would read as a loss the assignment caused.
type podsGated struct {
	mu       sync.Mutex
	m        map[string]map[string]string
	live     map[gateKey]map[types.UID]bool
	notReady map[gateKey]map[types.UID]bool
}

type gateKey struct{ pool, node, revision string }

func newPodsGated() *podsGated {
	return &podsGated{m: map[string]map[string]string{}, live: map[gateKey]map[types.UID]bool{},
		notReady: map[gateKey]map[types.UID]bool{}}
}

func (g *podsGated) passed(pool, node, revision string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.m[pool][node] == revision
}

func (g *podsGated) pass(pool, node, revision string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m[pool] == nil {
		g.m[pool] = map[string]string{}
	}
	g.m[pool][node] = revision
	delete(g.live, gateKey{pool, node, revision})
	delete(g.notReady, gateKey{pool, node, revision})
}

// assigning records the pods of node that are not Ready as the pool assigns it revision.
func (g *podsGated) assigning(pool, node, revision string, pods []corev1.Pod) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := gateKey{pool, node, revision}
	set := map[types.UID]bool{}
	for i := range pods {
		if ready, _ := readiness(&pods[i]); !ready {
			set[pods[i].UID] = true
		}
	}
	g.notReady[k] = set
}

// podMemory is what the controller saw of a node's pods since its assignment.
type podMemory struct {
	// running: the pod was seen running while the node was in the gate.
	running func(types.UID) bool
	// notReadyBefore: the pod was not Ready when the node was assigned, and not seen Ready since.
	notReadyBefore func(types.UID) bool
}

// saw records the pods of node that ran before at and have not finished, and those seen Ready, and
// returns what was seen of them while the node was in the gate.
func (g *podsGated) saw(pool, node, revision string, pods []corev1.Pod, at time.Time) podMemory {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := gateKey{pool, node, revision}
	seen := g.live[k]
	if seen == nil {
		seen = map[types.UID]bool{}
		g.live[k] = seen
	}
	notReady := g.notReady[k]
	for i := range pods {
		p := &pods[i]
		if p.CreationTimestamp.Time.Before(at) && p.Status.Phase != corev1.PodSucceeded &&
			p.Status.Phase != corev1.PodFailed {
			seen[p.UID] = true
		}
		if ready, _ := readiness(p); ready {
			delete(notReady, p.UID)
		}
	}
	running, before := maps.Clone(seen), maps.Clone(notReady)
	return podMemory{running: func(uid types.UID) bool { return running[uid] },
		notReadyBefore: func(uid types.UID) bool { return before[uid] }}
}

// prune forgets the pool's nodes that are no longer selected (deleted, relabelled).
func (g *podsGated) prune(pool string, selected map[string]*corev1.Node) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for node := range g.m[pool] {
		if selected[node] == nil {
			delete(g.m[pool], node)
		}
	}
	for _, m := range []map[gateKey]map[types.UID]bool{g.live, g.notReady} {
		for k := range m {
			if k.pool == pool && selected[k.node] == nil {
				delete(m, k)
			}
		}
	}
}

func (g *podsGated) forget(pool string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, pool)
	for k := range g.live {
		if k.pool == pool {
			delete(g.live, k)
		}
	}
	for k := range g.notReady {
		if k.pool == pool {
			delete(g.notReady, k)
		}
	}
}

// gatesPods says whether the controller must look at the pods of node v for the pool's target: the gate
// is on, v is assigned the target (with a known time) and did not fail it, it is within nodeTimeout of its
// assignment (and a little past, for a node still waiting then to fail its Timeout), and it has not passed
// the gate this term. The window counts from the assignment alone, not from the term's start as
// nodeTimeout does: a new leader must not hold every node it finds on the target (proven, maybe days
// ago) to its pods again.
func (c *Controller) gatesPods(pool *v1alpha1.KubeletConfigPool, target plan.Target, v plan.Node, now time.Time) bool {
	spec := &pool.Spec
	if spec.PodReadinessTimeoutOrDefault() == 0 || target.Revision == "" || !v.Assigned ||
		v.Revision != target.Revision || v.AssignedAt.IsZero() {
		return false
	}
	for _, f := range pool.Status.FailedNodes {
		if f.Name == v.Name && f.Revision == target.Revision {
			return false
		}
	}
	if !now.Before(v.AssignedAt.Add(spec.NodeTimeoutOrDefault() + podWindowGrace)) {
		return false
	}
	return !c.gated.passed(pool.Name, v.Name, target.Revision)
}

// podWindowGrace is how long past nodeTimeout a node's pods are still looked at: long enough for the
// decision that fails a node still waiting for them with Timeout (plan polls every few seconds).
const podWindowGrace = 30 * time.Second

// nodePods lists the pods bound to node; from the watch cache (ResourceVersion "0"): a pod's readiness a
// moment stale only delays the next decision by a poll.
func (c *Controller) nodePods(ctx context.Context, node string) ([]corev1.Pod, error) {
	list, err := c.cfg.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("spec.nodeName", node).String(),
		ResourceVersion: "0",
	})
	if err != nil {
		return nil, fmt.Errorf("list pods of node %s: %w", node, err)
	}
	out := list.Items[:0]
	for _, p := range list.Items {
		if p.Spec.NodeName == node { // a client that ignores field selectors (a fake) must not mix nodes
			out = append(out, p)
		}
	}
	return out, nil
}

// fared is how the pods that ran on a node before at (its assignment) fared since: those that lost their
// readiness after at and are not Ready again, and those the kubelet failed after at (by the time their
// status gives, or, when it gives none, because mem saw them running since the assignment). Pods created
// at or after at, pods being deleted (a drain's evictions, a scale-down) and pods that were already not
// Ready or failed before at are left out: they say nothing of what the assignment did. Not Ready before
// is what mem saw at the assignment (a restart moves the transition time of a Ready condition that was
// False already), else what the condition's time says (a new leader has no memory of the assignment).
func fared(pods []corev1.Pod, at time.Time, mem podMemory) []plan.Pod {
	var out []plan.Pod
	for _, p := range pods {
		if !p.CreationTimestamp.Time.Before(at) || p.DeletionTimestamp != nil {
			continue
		}
		name := p.Namespace + "/" + p.Name
		ready, readyChanged := readiness(&p)
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			continue
		case corev1.PodFailed:
			when := readyChanged
			if c := condition(&p, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
				when = c.LastTransitionTime.Time
			}
			// Only the kubelet's own verdicts on the pod, and only those it reached after the assignment;
			// a pod whose failure time is unknown counts only if it was seen running since.
			after := !when.IsZero() && !when.Before(at) || when.IsZero() && mem.running(p.UID)
			if kubeletFailure(p.Status.Reason) && after {
				out = append(out, plan.Pod{Name: name, Failed: strings.TrimSpace(p.Status.Reason + ": " + p.Status.Message)})
			}
		default:
			if !ready && !readyChanged.IsZero() && !readyChanged.Before(at) && !mem.notReadyBefore(p.UID) {
				out = append(out, plan.Pod{Name: name, NotReadySince: readyChanged})
			}
		}
	}
	return out
}

// kubeletFailure says whether a failed pod's reason is the kubelet's verdict on the node's capacity: its
// admission (OutOfpods, OutOfcpu, OutOfmemory, OutOf<extended resource>, UnexpectedAdmissionError), its
// eviction manager (Evicted), or its preemption of the pod to admit a critical one (Preempting).
func kubeletFailure(reason string) bool {
	return strings.HasPrefix(reason, "OutOf") || reason == "Evicted" || reason == "UnexpectedAdmissionError" ||
		reason == "Preempting"
}

// readiness is a pod's Ready condition: whether it is True, and when it last changed (zero if the pod
// has none).
func readiness(p *corev1.Pod) (bool, time.Time) {
	c := condition(p, corev1.PodReady)
	if c == nil {
		return false, time.Time{}
	}
	return c.Status == corev1.ConditionTrue, c.LastTransitionTime.Time
}

func condition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
