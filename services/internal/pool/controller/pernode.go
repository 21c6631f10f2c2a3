// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
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
	prog, err := pernode.Compile(pool.Spec.PerNode)
	if err != nil {
		return pool, nil, &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: err.Error()}, nil
	}
	ref := pool.Spec.ConfigMap
	out := map[string]plan.NodeTarget{}
	groups := map[string]*nodeGroup{}
	for _, n := range sortedByName(selected) {
		res, err := prog.Compute(n, ref.KubeletConfigKey, data, now)
		if err != nil {
			out[n.Name] = plan.NodeTarget{Revision: base, Source: revision.Source(pool, base),
				Refused: fmt.Sprintf("its values of revision %s cannot be computed: %v", base, err)}
			continue
		}
		rev := revision.Name(ref.Namespace, ref.KubeletConfigKey, res.Data)
		g := groups[rev]
		if g == nil {
			g = &nodeGroup{data: res.Data, values: res.Values}
			groups[rev] = g
		}
		g.nodes = append(g.nodes, n)
		out[n.Name] = plan.NodeTarget{Revision: rev, Source: revision.Source(pool, rev), Values: res.Values,
			NextChange: res.NextChange}
	}
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
func assignedTargets(pool *v1alpha1.KubeletConfigPool, base string, selected []*corev1.Node) map[string]plan.NodeTarget {
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
