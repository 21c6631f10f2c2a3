// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// selector is a pool's nodeSelector, parsed once per sync.
type selector struct {
	pool string
	sel  labels.Selector
}

// assignmentOf reads a Node's v1alpha1.AnnotationAssignment; ok is false when it is absent or not the
// JSON of an Assignment (then the pool treats the node as never assigned: its source is the pool's).
func assignmentOf(n *corev1.Node) (v1alpha1.Assignment, bool) {
	raw, ok := n.Annotations[v1alpha1.AnnotationAssignment]
	if !ok {
		return v1alpha1.Assignment{}, false
	}
	var a v1alpha1.Assignment
	if json.Unmarshal([]byte(raw), &a) != nil || a.Pool == "" || a.Revision == "" {
		return v1alpha1.Assignment{}, false
	}
	return a, true
}

// LabelSidecar set to "disabled" keeps the sidecar DaemonSet off a Node (deploy/base/sidecar.yaml).
const LabelSidecar = "dkc.dev/sidecar"

// noSidecar says why the sidecar DaemonSet does not run on n, "" when it may: the DaemonSet's own node
// selection (deploy/base/sidecar.yaml: nodeSelector kubernetes.io/os: linux, and not labelled
// dkc.dev/sidecar=disabled). A Node without the os label at all (a kubelet always sets it; only Node
// objects made by hand lack it) is left to the status rule: a node whose sidecar never reported is held
// too (plan.Node.NoStatus).
func noSidecar(n *corev1.Node) string {
	if os, ok := n.Labels[corev1.LabelOSStable]; ok && os != "linux" {
		return corev1.LabelOSStable + " is " + os
	}
	if n.Labels[LabelSidecar] == "disabled" {
		return "labelled " + LabelSidecar + "=disabled"
	}
	return ""
}

// statusOf reads a Node's dkc.dev/config-status; zero when absent or unreadable (nothing reported).
func statusOf(n *corev1.Node) corev1.NodeConfigStatus {
	var st corev1.NodeConfigStatus
	if raw, ok := n.Annotations[nodeconfig.StatusAnnotation]; ok {
		if json.Unmarshal([]byte(raw), &st) != nil {
			return corev1.NodeConfigStatus{}
		}
	}
	return st
}

// maxDetail bounds the part of a node's ConfigOK message a pool repeats: its failed nodes' errors all go
// into one condition message.
const maxDetail = 2048

// configDetail is the message of n's ConfigOK condition while it is False, without the status error it
// starts with (statusErr): the config the node uses and the sidecar's detail, bounded by maxDetail; "" when
// none.
func configDetail(n *corev1.Node, statusErr string) string {
	for _, c := range n.Status.Conditions {
		if c.Type != nodeconfig.ConditionType || c.Status != corev1.ConditionFalse {
			continue
		}
		msg := strings.TrimPrefix(c.Message, statusErr+"; ")
		if len(msg) > maxDetail {
			return strings.ToValidUTF8(msg[:maxDetail], "") + "…"
		}
		return msg
	}
	return ""
}

// driftOf is the Node's ConfigDrift condition when True, as "<cause>: <message>" (plan.Node.Drift); "" when
// it has none or it is not True.
func driftOf(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == nodeconfig.DriftConditionType && c.Status == corev1.ConditionTrue {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// names says whether a Node's source is exactly the ConfigMap source s.
func names(src *corev1.NodeConfigSource, s corev1.ConfigMapNodeConfigSource) bool {
	if src == nil || src.ConfigMap == nil {
		return false
	}
	c := src.ConfigMap
	return c.Namespace == s.Namespace && c.Name == s.Name && c.KubeletConfigKey == s.KubeletConfigKey
}

// view is what the planner sees of node n for pool: its source compared with the target's snapshot and
// with the snapshot the pool last assigned it (its AnnotationAssignment), its reported status, Ready, the
// other pools whose selectors pick it. A source that is not usable (malformed, outside
// --config-namespaces) is no pool's snapshot: the node is then not assigned anything of the pool.
func view(n *corev1.Node, pool *v1alpha1.KubeletConfigPool, target plan.Target, others []selector,
	allowed resolve.Namespaces) plan.Node {
	src, _, err := resolve.NodeSource(n, allowed)
	if err != nil {
		src = nil
	}
	_, reported := n.Annotations[nodeconfig.StatusAnnotation]
	v := plan.Node{Name: n.Name, Status: statusOf(n), Ready: ready(n), NoSidecar: noSidecar(n), NoStatus: !reported,
		Drift: driftOf(n)}
	v.DriftCause, v.DriftSince, _ = nodeconfig.DriftOf(n)
	v.Repair = repairOf(n, v.Status)
	if v.Status.Error != "" {
		v.Detail = configDetail(n, v.Status.Error)
	}
	v.Assigned = target.Revision != "" && names(src, target.Source)
	if a, ok := assignmentOf(n); ok && a.Pool == pool.Name {
		assigned := revision.AssignedSource(pool, a)
		switch {
		case names(src, assigned):
			// The source is still what the pool assigned.
			v.Revision, v.Source = a.Revision, assigned
			if a.Revision == target.Revision || !v.Assigned {
				v.AssignedAt = a.Time.Time
			}
		case !v.Assigned:
			// Someone set another source since; set back to the target, the node is the pool's again.
			v.HandAssigned = true
		}
	}
	lbls := labels.Set(n.Labels)
	for _, o := range others {
		if o.pool != pool.Name && o.sel.Matches(lbls) {
			v.OtherPools = append(v.OtherPools, o.pool)
		}
	}
	return v
}

// expectations remember the assignments a controller made until its Node cache shows them: a node
// assigned a moment ago and still unassigned in the cache would look pending, free a slot it does not
// free, and a second sync would assign another node past maxUnavailable (the ReplicaSet controller's
// expectations, for the same reason).
type expectations struct {
	mu sync.Mutex
	// by pool, then node
	m map[string]map[string]expected
}

type expected struct {
	a v1alpha1.Assignment
	// made is when the patch was sent, by the controller's clock: an expectation the cache never
	// confirms (the Node was deleted, the patch's watch event got lost in a relist that also
	// dropped it) is forgotten after expectationTTL.
	made time.Time
}

// expectationTTL bounds how long an unconfirmed assignment overrides the cache. A watch event takes
// milliseconds; a relist after a lost watch a few seconds.
const expectationTTL = 2 * time.Minute

func newExpectations() *expectations { return &expectations{m: map[string]map[string]expected{}} }

func (e *expectations) expect(pool, node string, a v1alpha1.Assignment, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m[pool] == nil {
		e.m[pool] = map[string]expected{}
	}
	e.m[pool][node] = expected{a: a, made: now}
}

func (e *expectations) drop(pool, node string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m[pool], node)
}

func (e *expectations) forget(pool string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, pool)
}

// apply returns v as the node would be once the cache showed the pool's pending assignment to it, and
// drops the expectation once the cached Node shows it (its AnnotationAssignment is the one sent).
func (e *expectations) apply(pool *v1alpha1.KubeletConfigPool, n *corev1.Node, v plan.Node, target plan.Target,
	now time.Time) plan.Node {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.m[pool.Name][n.Name]
	if !ok {
		return v
	}
	if cur, found := assignmentOf(n); (found && cur.Pool == x.a.Pool && cur.Revision == x.a.Revision &&
		cur.Time.Equal(&x.a.Time)) ||
		now.Sub(x.made) > expectationTTL {
		delete(e.m[pool.Name], n.Name)
		return v
	}
	v.Revision, v.Source, v.AssignedAt, v.HandAssigned =
		x.a.Revision, revision.AssignedSource(pool, x.a), x.a.Time.Time, false
	v.Assigned = x.a.Revision == target.Revision
	return v
}

// unconfirmed is how long until the pool's unconfirmed assignments expire, 0 when it has none left.
func (e *expectations) unconfirmed(pool string, now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	var wait time.Duration
	for _, x := range e.m[pool] {
		if d := x.made.Add(expectationTTL).Sub(now); d > wait {
			wait = d
		}
	}
	return wait
}

// assignedAnywhere says whether any pool has an unconfirmed assignment of node that has not expired (one
// of a node that left its pool is never confirmed, as apply runs only for selected nodes).
func (e *expectations) assignedAnywhere(node string, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.m {
		if x, ok := m[node]; ok && now.Sub(x.made) <= expectationTTL {
			return true
		}
	}
	return false
}

// revisions are the revisions of a pool's unconfirmed assignments: their snapshots are in use though no
// cached Node shows it yet.
func (e *expectations) revisions(pool string, now time.Time) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, x := range e.m[pool] {
		if now.Sub(x.made) <= expectationTTL { // one of a node that left the pool is never confirmed
			out = append(out, x.a.Revision)
		}
	}
	return out
}

// pending counts a pool's unconfirmed assignments (for tests and logs).
func (e *expectations) pending(pool string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.m[pool])
}
