// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// Revision snapshots are deleted here, and only here: prune drops a live pool's revisions past its
// history limit, collect those of a pool that is gone, and sweep finds the pools gone while no replica
// led. None deletes a snapshot some Node still uses.

// sweepInterval is how often the controller looks for snapshots of deleted pools (sweep); the first look
// is when it starts leading.
const sweepInterval = 10 * time.Minute

// deleteSnapshot deletes s, the very object the cache shows: one deleted and created again since (a pool
// re-created under its name) is a Conflict, not deleted.
func (c *Controller) deleteSnapshot(ctx context.Context, s *corev1.ConfigMap) error {
	return c.cfg.Client.CoreV1().ConfigMaps(s.Namespace).Delete(ctx, s.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
}

// deletedSnapshot records that s is gone (or was already), until ensureSnapshot creates it again.
func (c *Controller) deletedSnapshot(s *corev1.ConfigMap) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted[s.Namespace+"/"+s.Name] = true
}

// snapshotsOf are the pool's snapshots in every watched namespace: only what isSnapshot accepts, as prune
// and collect delete what this returns.
func (c *Controller) snapshotsOf(pool string) []*corev1.ConfigMap {
	var out []*corev1.ConfigMap
	for _, inf := range c.snapshots {
		objs, _ := inf.GetIndexer().ByIndex(indexPool, pool)
		for _, o := range objs {
			if cm, ok := o.(*corev1.ConfigMap); ok && isSnapshot(cm, pool) {
				out = append(out, cm)
			}
		}
	}
	return out
}

// isSnapshot tells the pool's revision snapshot (revision.Snapshot: labelled with its revision, named for
// it, immutable) from another ConfigMap a user labelled dkc.dev/pool — the pool's own source ConfigMap,
// say — which the controller must never delete. The admission policy dkc-server-configmaps holds dkc-server
// to the same shape.
func isSnapshot(cm *corev1.ConfigMap, pool string) bool {
	rev := cm.Labels[v1alpha1.LabelRevision]
	return rev != "" && cm.Labels[v1alpha1.LabelPool] == pool && cm.Name == revision.SnapshotName(pool, rev) &&
		cm.Immutable != nil && *cm.Immutable
}

// usedConfigMaps are the ConfigMaps ("namespace/name") some Node's source names or its status shows
// active or last-known-good: a snapshot among them is never deleted.
func usedConfigMaps(nodes []*corev1.Node, allowed resolve.Namespaces) map[string]bool {
	used := map[string]bool{}
	add := func(s *corev1.NodeConfigSource) {
		if s != nil && s.ConfigMap != nil {
			used[s.ConfigMap.Namespace+"/"+s.ConfigMap.Name] = true
		}
	}
	for _, n := range nodes {
		if src, _, err := resolve.NodeSource(n, allowed); err == nil {
			add(src)
		}
		st := statusOf(n)
		add(st.Active)
		add(st.LastKnownGood)
		add(st.Assigned)
	}
	return used
}

// prune deletes the pool's revisions past its history limit that no node uses, and the node revisions
// (spec.perNode) that neither a node uses nor the current revision's nodes are to run (targets).
func (c *Controller) prune(ctx context.Context, pool *v1alpha1.KubeletConfigPool, st v1alpha1.KubeletConfigPoolStatus,
	targets map[string]bool, nodes []*corev1.Node) error {
	snaps := c.snapshotsOf(pool.Name)
	if len(snaps) <= 2 {
		return nil
	}
	used := usedConfigMaps(nodes, c.cfg.Namespaces)
	inUse := map[string]bool{}
	var kept []revision.Kept
	byRev := map[string]*corev1.ConfigMap{}
	var stale []string // node revisions (spec.perNode) neither used nor a target: made again if need be
	for _, s := range snaps {
		rev := s.Labels[v1alpha1.LabelRevision]
		if used[s.Namespace+"/"+s.Name] || targets[rev] {
			inUse[rev] = true
		}
		byRev[rev] = s
		if s.Labels[v1alpha1.LabelBaseRevision] != "" {
			// Not history: undo goes back to a pool revision, whose node revisions are computed again.
			if !inUse[rev] && rev != st.CurrentRevision && rev != st.PreviousRevision {
				stale = append(stale, rev)
			}
			continue
		}
		kept = append(kept, revision.Kept{Revision: rev, Created: s.CreationTimestamp.Time})
	}
	if st.Preview != nil {
		// The nodes' sidecars read it while they preview it, and it is assigned next unless refused.
		inUse[st.Preview.Revision] = true
	}
	limit := int(pool.Spec.RevisionHistoryLimitOrDefault())
	for _, rev := range append(stale, revision.Prune(kept, st.CurrentRevision, st.PreviousRevision, inUse, limit)...) {
		s := byRev[rev]
		err := c.deleteSnapshot(ctx, s)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("prune revision %s/%s: %w", s.Namespace, s.Name, err)
		}
		c.deletedSnapshot(s)
		c.log.Info("pruned revision", zap.String("pool", pool.Name), zap.String("revision", rev))
	}
	return nil
}

// collect deletes the snapshots of a pool that no longer exists which no Node uses: snapshots carry no
// owner reference (a finalizer to orphan the ones in use would wedge the CRD's deletion whenever
// dkc-server is gone), so this is their garbage collector. A snapshot a Node still uses stays until it
// does not (sweep looks again); so does every snapshot while an assignment the pool made just before its
// deletion may not be in the Node cache yet.
func (c *Controller) collect(ctx context.Context, pool string) (time.Duration, error) {
	if d := c.exp.unconfirmed(pool, c.clock.Now()); d > 0 {
		return d, nil
	}
	c.exp.forget(pool)
	snaps := c.snapshotsOf(pool)
	if len(snaps) == 0 {
		return 0, nil
	}
	all, err := c.nodes.List(labels.Everything())
	if err != nil {
		return 0, fmt.Errorf("list nodes: %w", err)
	}
	used := usedConfigMaps(all, c.cfg.Namespaces)
	for _, s := range snaps {
		if used[s.Namespace+"/"+s.Name] {
			continue
		}
		err := c.deleteSnapshot(ctx, s)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return 0, fmt.Errorf("delete revision %s/%s of deleted pool %s: %w", s.Namespace, s.Name, pool, err)
		}
		c.deletedSnapshot(s)
		c.log.Info("deleted revision of a deleted pool", zap.String("pool", pool),
			zap.String("configmap", s.Namespace+"/"+s.Name))
	}
	return 0, nil
}

// sweep queues every pool that has snapshots and no longer exists: pools deleted while this replica did
// not lead (or dkc-server was down), and snapshots of deleted pools that Nodes used until lately (a Node
// event does not always name the deleted pool).
func (c *Controller) sweep(context.Context) {
	for _, inf := range c.snapshots {
		for _, pool := range inf.GetIndexer().ListIndexFuncValues(indexPool) {
			if _, err := c.poolList.Get(pool); apierrors.IsNotFound(err) {
				c.queue.Add(pool)
			}
		}
	}
}
