// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/internal/payload"
	"github.com/dkc-dev/dkc/internal/pernode"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// Per-node values (spec.perNode): each selected node gets the pool's revision with its own values applied,
// which is a revision of its own — a content hash like any other, with its own immutable snapshot recorded
// in the pool's status — so that everything built on revisions (the UID record dkc-server serves by, the
// kubelet check per minor, failures per revision, pruning) holds per node unchanged. Nodes whose values
// are equal share one revision; a node whose values change nothing runs the pool's revision itself.

// maxNodeRevisions bounds the distinct configs a pool's per-node values may make of one revision: each is
// a snapshot ConfigMap and a record in the pool's status.
const maxNodeRevisions = 100

// nodeGroup is the selected nodes whose values make one revision.
type nodeGroup struct {
	data   map[string]string
	values []string
	nodes  []*corev1.Node
}

// nodeTargets computes each selected node's own revision of the pool's revision base, whose ConfigMap data
// are data, checks each new one with the kubelet code of its nodes' minors, and creates and records its
// snapshot (unless every node of it is refused). A node whose values cannot be computed, or whose minor
// refuses them, is refused (plan.NodeTarget.Refused): it fails its revision without being touched, as a node
// whose kubelet refuses its config would. The pool returned is the one to go on with (its snapshot record
// may have been written); invalid, when the expressions do not compile, make too many configs, or a
// snapshot's name is taken.
func (c *Controller) nodeTargets(ctx context.Context, pool *v1alpha1.KubeletConfigPool, base string,
	data map[string]string, selected []*corev1.Node, now time.Time) (*v1alpha1.KubeletConfigPool,
	map[string]plan.NodeTarget, *plan.Invalid, error) {
	values, err := c.computed.of(pool, base)
	if err != nil {
		return pool, nil, &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: err.Error()}, nil
	}
	ref := pool.Spec.ConfigMap
	out := map[string]plan.NodeTarget{}
	groups := map[string]*nodeGroup{}
	for _, n := range sortedByName(selected) {
		res, rev, err := values.compute(n, ref, data, now)
		if err == nil {
			err = payload.CheckSize(res.Data) // what a node refuses as too large
		}
		if err != nil {
			out[n.Name] = plan.NodeTarget{Revision: plan.Uncomputed,
				Refused: fmt.Sprintf("its values of revision %s cannot be computed: %v", base, err)}
			continue
		}
		g := groups[rev]
		if g == nil {
			g = &nodeGroup{data: res.Data, values: res.Values}
			groups[rev] = g
		}
		g.nodes = append(g.nodes, n)
		out[n.Name] = plan.NodeTarget{Revision: rev, Source: revision.Source(pool, rev), Values: res.Values,
			NextChange: res.NextChange}
	}
	values.keep(selected)
	if len(groups) > maxNodeRevisions {
		return pool, nil, &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: fmt.Sprintf(
			"spec.perNode makes %d different configs of revision %s for the selected nodes, more than %d: round the "+
				"values (to GiB, to tens of pods) so that nodes share them", len(groups), base, maxNodeRevisions)}, nil
	}
	for _, rev := range slices.Sorted(maps.Keys(groups)) {
		g := groups[rev]
		if rev == base {
			continue // the pool's own revision: checked and frozen as such
		}
		if err := c.checkNodeRevision(ctx, ref, base, rev, g, out); err != nil {
			return pool, nil, nil, err
		}
		if !slices.ContainsFunc(g.nodes, func(n *corev1.Node) bool { return out[n.Name].Refused == "" }) {
			continue // sent to no node
		}
		_, snap := revision.NodeSnapshot(pool, ref.Namespace, base, g.data)
		var invalid *plan.Invalid
		if pool, invalid, err = c.ensureSnapshot(ctx, pool, ref.KubeletConfigKey, rev, snap); err != nil || invalid != nil {
			return pool, nil, invalid, err
		}
	}
	return pool, out, nil, nil
}

// checkNodeRevision runs the kubelet's own loading and validation on a node revision rev of base with the
// code of each minor among the nodes it is for, as kubeletChecks.check does for a pool's revision; the
// nodes of a minor that refuses it are refused in out. The error is ctx's.
func (c *Controller) checkNodeRevision(ctx context.Context, ref v1alpha1.ConfigMapReference, base, rev string,
	g *nodeGroup, out map[string]plan.NodeTarget) error {
	if c.kubelets == nil || c.kubelets.checker == nil {
		return nil
	}
	content := []byte(g.data[ref.KubeletConfigKey])
	versions := kubeletMinors(g.nodes)
	for _, minor := range slices.SortedFunc(maps.Keys(versions), checkapi.CompareMinors) {
		v := versions[minor]
		o, err := c.kubelets.outcome(ctx, ref, rev, content, minor, v.version)
		if err != nil {
			return err
		}
		if o.err == nil {
			continue
		}
		for _, n := range g.nodes {
			if checkapi.Minor(n.Status.NodeInfo.KubeletVersion) != minor {
				continue
			}
			nt := out[n.Name]
			nt.Refused = fmt.Sprintf("the kubelet %s refuses its own revision %s of revision %s (%s; checked with "+
				"kubelet %s's code before the node is touched): %v", minor, rev, base, orNoValues(g.values), v.version, o.err)
			out[n.Name] = nt
		}
	}
	return nil
}

func orNoValues(values []string) string {
	if len(values) == 0 {
		return "no values"
	}
	return strings.Join(values, ", ")
}

// assignedTargets are the nodes' own revisions of the pool's revision base as the pool last assigned them:
// what the nodes are judged against while the pool's per-node values cannot be computed now (the config is
// invalid, or the expressions do not compile). A node assigned none is judged against base, and nothing is
// assigned meanwhile.
func assignedTargets(pool *v1alpha1.KubeletConfigPool, base string,
	selected []*corev1.Node) map[string]plan.NodeTarget {
	out := map[string]plan.NodeTarget{}
	for _, n := range selected {
		a, ok := assignmentOf(n)
		if !ok || a.Pool != pool.Name {
			continue
		}
		if r, recorded := pool.Status.RevisionSnapshots.Snapshot(a.Revision); recorded && r.BaseRevision == base {
			var values []string
			for _, nr := range pool.Status.NodeRevisions {
				if nr.Revision == a.Revision {
					values = nr.Values
				}
			}
			out[n.Name] = plan.NodeTarget{Revision: a.Revision, Source: revision.AssignedSource(pool, a), Values: values}
		}
	}
	return out
}

// computedValues keep each pool's compiled spec.perNode and each selected node's result between syncs: a
// sync computes every selected node's config (a CEL evaluation and a YAML document, ~0.2–0.5 ms), and a
// pool syncs on every change of any of its nodes. A node's result is kept while the pool's per-node spec,
// its revision and the Node (its resourceVersion) are the same, and until the soonest exception applied to
// it expires.
type computedValues struct {
	mu    sync.Mutex
	pools map[string]*poolValues
}

// poolValues are one pool's: for one per-node spec and revision.
type poolValues struct {
	spec, base string
	prog       *pernode.Program
	err        error
	mu         sync.Mutex
	nodes      map[string]nodeValues
}

// nodeValues are one node's result, for the Node at resourceVersion.
type nodeValues struct {
	uid, resourceVersion string
	res                  pernode.Result
	rev                  string
	err                  error
}

func newComputedValues() *computedValues { return &computedValues{pools: map[string]*poolValues{}} }

// of returns the pool's values for its per-node spec and revision base; the error is the spec's compile
// error.
func (c *computedValues) of(pool *v1alpha1.KubeletConfigPool, base string) (*poolValues, error) {
	raw, err := json.Marshal(pool.Spec.PerNode)
	if err != nil {
		return nil, fmt.Errorf("spec.perNode: %w", err)
	}
	spec := string(raw) + "\x00" + pool.Spec.ConfigMap.Namespace + "\x00" + pool.Spec.ConfigMap.KubeletConfigKey
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pools[pool.Name]
	if p == nil || p.spec != spec || p.base != base {
		p = &poolValues{spec: spec, base: base, nodes: map[string]nodeValues{}}
		p.prog, p.err = pernode.Compile(pool.Spec.PerNode)
		c.pools[pool.Name] = p
	}
	return p, p.err
}

func (c *computedValues) forget(pool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pools, pool)
}

// compute is node n's config of the pool's revision (data) and its revision name, kept or computed now.
func (p *poolValues) compute(n *corev1.Node, ref v1alpha1.ConfigMapReference, data map[string]string,
	now time.Time) (pernode.Result, string, error) {
	p.mu.Lock()
	kept, ok := p.nodes[n.Name]
	p.mu.Unlock()
	if ok && n.ResourceVersion != "" && kept.uid == string(n.UID) && kept.resourceVersion == n.ResourceVersion &&
		(kept.res.NextChange.IsZero() || now.Before(kept.res.NextChange)) {
		return kept.res, kept.rev, kept.err
	}
	v := nodeValues{uid: string(n.UID), resourceVersion: n.ResourceVersion}
	v.res, v.err = p.prog.Compute(n, ref.KubeletConfigKey, data, now)
	if v.err != nil {
		// Not kept: an exception that expires may end it, and a failing node is no steady state.
		return v.res, "", v.err
	}
	v.rev = revision.Name(ref.Namespace, ref.KubeletConfigKey, v.res.Data)
	p.mu.Lock()
	p.nodes[n.Name] = v
	p.mu.Unlock()
	return v.res, v.rev, v.err
}

// keep drops the results of nodes the pool no longer selects.
func (p *poolValues) keep(selected []*corev1.Node) {
	names := make(map[string]bool, len(selected))
	for _, n := range selected {
		names[n.Name] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	maps.DeleteFunc(p.nodes, func(name string, _ nodeValues) bool { return !names[name] })
}
