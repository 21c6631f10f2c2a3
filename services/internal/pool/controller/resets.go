// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/disruption"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// maxResetNodes bounds the nodes a DrainRequired message names; the rest are counted.
const maxResetNodes = 5

// stateResets refuses a new revision that the kubelet would refuse to start with on the state its
// resource managers checkpointed under the config a selected node runs now (disruption.Resets: another
// CPU or memory manager policy, or other reservations under a static one). dkc does not drain nodes: each
// node assigned such a revision would only fail it and be rolled back, and the pool halt, so nothing is
// assigned and ConfigInvalid says which nodes and state files, and how to make the change by hand.
//
// A node is judged when it runs one of the pool's own revisions (its status's active source is one of the
// pool's snapshots): both configs are then known, and compared as the kubelet of the node's minor
// runs them (its defaults applied, by the same helper as the kubelet check). The config of a node on
// its local config, or on a source the pool did not assign, is not known here: its kubelet refuses the
// change itself, and its sidecar rolls it back. A node's flags (which the helper does not see here) are
// not compared either; the manager settings are seldom set by flag.
func (c *Controller) stateResets(ctx context.Context, pool *v1alpha1.KubeletConfigPool, rev string, content []byte,
	selected []*corev1.Node) (*plan.Invalid, error) {
	ref := pool.Spec.ConfigMap
	versions := kubeletMinors(selected)
	var found []string
	nodes := 0
	for _, n := range sortedByName(selected) {
		minor := checkapi.Minor(n.Status.NodeInfo.KubeletVersion)
		running, snapshot := runningRevision(pool, statusOf(n))
		if minor == "" || running == "" || running == rev {
			continue
		}
		version := versions[minor].version
		next, err := c.kubelets.outcome(ctx, ref, rev, content, minor, version)
		if err != nil {
			return nil, err
		}
		cm := c.cachedSnapshot(snapshot.Namespace + "/" + snapshot.Name)
		if next.fields == nil || cm == nil ||
			revision.Verify(cm, pool.Name, running, snapshot.KubeletConfigKey, pool.Status.RevisionSnapshots, true) != nil {
			// Not checked (logged), the snapshot gone, or not the one the pool made (its outcome would be kept
			// as the revision's): the node's kubelet decides.
			continue
		}
		was, err := c.kubelets.outcome(ctx, ref, running, []byte(cm.Data[snapshot.KubeletConfigKey]), minor, version)
		if err != nil {
			return nil, err
		}
		if was.fields == nil {
			continue
		}
		resets := disruption.Resets(was.fields, next.fields)
		if len(resets) == 0 {
			continue
		}
		nodes++
		if nodes <= maxResetNodes {
			r := make([]string, len(resets))
			for i, x := range resets {
				r[i] = x.String()
			}
			found = append(found, fmt.Sprintf("node %s (revision %s, kubelet %s): %s", n.Name, running, minor,
				strings.Join(r, ", ")))
		}
	}
	if nodes == 0 {
		return nil, nil
	}
	if nodes > maxResetNodes {
		found = append(found, fmt.Sprintf("and %d more nodes", nodes-maxResetNodes))
	}
	// Each sync while the revision stays refused decides the same; the condition's change makes the Event.
	c.log.Debug("refused a pool's revision: its nodes' kubelets would refuse it on their checkpointed state",
		zap.String("pool", pool.Name), zap.String("revision", rev), zap.Int("nodes", nodes))
	return &plan.Invalid{Reason: v1alpha1.ReasonDrainRequired,
		Message: fmt.Sprintf("configmap %s/%s (revision %s) key %q: the kubelet refuses to start with it on the "+
			"state its resource managers checkpointed under the revision the node runs, until the node is drained and "+
			"the state file removed; a pool does not drain nodes, so nothing is assigned while a selected node runs a revision "+
			"it conflicts with: %s. To make the change, take the nodes out of the pool and run kubectl dkc assign "+
			"NODE... --configmap %s/%s --key %s --drain (it drains one node at a time, its sidecar removes the state "+
			"file, and it uncordons the node once it runs the config)",
			ref.Namespace, ref.Name, rev, ref.KubeletConfigKey, strings.Join(found, "; "), ref.Namespace, ref.Name,
			ref.KubeletConfigKey)}, nil
}

// runningRevision is the pool's revision a node's kubelet runs, by its status's active source, and that
// revision's snapshot; "" when the node runs something else or nothing reported yet.
func runningRevision(pool *v1alpha1.KubeletConfigPool, st corev1.NodeConfigStatus) (string, v1alpha1.RevisionSnapshot) {
	if st.Active == nil || st.Active.ConfigMap == nil || pool.Status.RevisionSnapshots == nil {
		return "", v1alpha1.RevisionSnapshot{}
	}
	a := st.Active.ConfigMap
	for _, s := range pool.Status.RevisionSnapshots.Items {
		if s.Namespace == a.Namespace && s.Name == a.Name && s.KubeletConfigKey == a.KubeletConfigKey {
			return s.Revision, s
		}
	}
	return "", v1alpha1.RevisionSnapshot{}
}

// sortedByName is nodes in name order, for messages that do not change from sync to sync.
func sortedByName(nodes []*corev1.Node) []*corev1.Node {
	out := slices.Clone(nodes)
	slices.SortFunc(out, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}
