// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// A revision's snapshot is what every node of the revision runs, so the controller uses only the object it
// created itself: the pool's status records the UID of each snapshot it creates (revisionSnapshots),
// stored before any node is assigned the revision, and dkc-server serves a snapshot only with that UID
// (services/internal/controller). An object of the snapshot's name that the pool does not record —
// created before the pool by someone else, or deleted and created again — or whose data is not the
// revision's is refused: the pool's ConfigMap is ConfigInvalid (SnapshotMismatch) and no node is assigned
// the revision until the operator deletes the object (docs/pools.md, "Revision snapshots").

// ensureSnapshot creates the revision's snapshot unless it exists, checks the one that exists, and
// records it in the pool's status. It returns the pool as stored once the record is written (the sync's
// own status write goes on top of it), or invalid when the object holding the snapshot's name is not one
// the pool may use.
func (c *Controller) ensureSnapshot(ctx context.Context, pool *v1alpha1.KubeletConfigPool, key, rev string,
	snap *corev1.ConfigMap) (*v1alpha1.KubeletConfigPool, *plan.Invalid, error) {
	rec := c.adopt(pool, rev, snap)
	k := snap.Namespace + "/" + snap.Name
	got := c.cachedSnapshot(k)
	if got == nil {
		created, err := c.cfg.Client.CoreV1().ConfigMaps(snap.Namespace).Create(ctx, snap,
			metav1.CreateOptions{FieldManager: FieldManager})
		switch {
		case err == nil:
			got = created
			c.mu.Lock()
			c.created[k] = created.UID
			c.mu.Unlock()
			c.log.Info("created revision", zap.String("pool", pool.Name), zap.String("revision", rev),
				zap.String("configmap", k), zap.String("uid", string(created.UID)))
		case apierrors.IsAlreadyExists(err):
			// Not in the cache: not labelled as a snapshot, or the cache is behind. The object decides.
			if got, err = c.cfg.Client.CoreV1().ConfigMaps(snap.Namespace).Get(ctx, snap.Name, metav1.GetOptions{}); err != nil {
				return pool, nil, fmt.Errorf("read snapshot configmap %s: %w", k, err)
			}
		default:
			return pool, nil, fmt.Errorf("create snapshot configmap %s: %w", k, err)
		}
		// It exists again: from here the cache answers, once it has caught up.
		c.mu.Lock()
		delete(c.deleted, k)
		c.mu.Unlock()
	}
	c.mu.Lock()
	mine := c.created[k] == got.UID
	c.mu.Unlock()
	if err := checkSnapshot(got, pool.Name, rev, key, rec, mine); err != nil {
		c.log.Warn("revision snapshot refused: no node is assigned the revision", zap.String("pool", pool.Name),
			zap.String("revision", rev), zap.String("configmap", k), zap.String("uid", string(got.UID)), zap.Error(err))
		return pool, &plan.Invalid{Reason: v1alpha1.ReasonSnapshotMismatch,
			Message: err.Error() + "; delete it and the pool creates the snapshot again"}, nil
	}
	rec = withSnapshot(rec, v1alpha1.RevisionSnapshot{Revision: rev, Namespace: got.Namespace, Name: got.Name,
		UID: got.UID, KubeletConfigKey: key, BaseRevision: snap.Labels[v1alpha1.LabelBaseRevision]})
	if apiequality.Semantic.DeepEqual(rec, pool.Status.RevisionSnapshots) {
		return pool, nil, nil
	}
	// Stored before any node is assigned the revision: dkc-server serves the snapshot with this UID only.
	up := pool.DeepCopy()
	up.Status.RevisionSnapshots = rec
	stored, err := c.updateStatus(ctx, up)
	if err != nil {
		return pool, nil, fmt.Errorf("record revision snapshot %s in kubeletconfigpool %s: %w", k, pool.Name, err)
	}
	c.mu.Lock()
	delete(c.created, k)
	c.mu.Unlock()
	return stored, nil, nil
}

// checkSnapshot says why the controller must not use got as pool's revision rev: it must be the one the
// pool records (or one this controller created and did not record yet: a failed status write), and pass
// revision.Verify.
func checkSnapshot(got *corev1.ConfigMap, pool, rev, key string, rec *v1alpha1.RevisionSnapshots, mine bool) error {
	r, ok := rec.Snapshot(rev)
	if !mine && (!ok || r.Namespace != got.Namespace || r.Name != got.Name || r.UID != got.UID) {
		why := "the pool records no snapshot of revision " + rev
		if ok {
			why = fmt.Sprintf("the pool records UID %s for revision %s", r.UID, rev)
		}
		detail := "not created by pool " + pool + ": " + why
		if h := revision.Name(got.Namespace, key, got.Data); h != rev {
			detail += fmt.Sprintf("; its data is revision %s", h)
		}
		return &revision.Mismatch{Namespace: got.Namespace, Name: got.Name, UID: string(got.UID), Detail: detail}
	}
	mineRec := withSnapshot(rec, v1alpha1.RevisionSnapshot{Revision: rev, Namespace: got.Namespace, Name: got.Name,
		UID: got.UID, KubeletConfigKey: key})
	return revision.Verify(got, pool, rev, key, mineRec, false)
}

// adopt returns the pool's record of its snapshots, never nil. A pool whose status predates the record
// (it has a current revision, and no record at all) adopts, once, the snapshot of rev — the revision its
// ConfigMap holds now — when that object's data are byte for byte snap's, the snapshot the pool would
// create from its ConfigMap: whoever created it, it holds the operator's config. No other snapshot is
// adopted: a revision's name is a short digest, not proof of content, and an earlier revision has nothing
// left to compare its snapshot with. Those stay unrecorded: dkc-server serves one only to nodes that
// already run it, and undo refuses it (docs/pools.md, "Upgrading from a dkc that did not record
// snapshots"). Once the record is stored this happens no more.
func (c *Controller) adopt(pool *v1alpha1.KubeletConfigPool, rev string,
	snap *corev1.ConfigMap) *v1alpha1.RevisionSnapshots {
	if pool.Status.RevisionSnapshots != nil {
		return pool.Status.RevisionSnapshots.DeepCopy()
	}
	rec := &v1alpha1.RevisionSnapshots{}
	if pool.Status.CurrentRevision == "" {
		return rec // a new pool: it created nothing yet
	}
	for _, s := range c.snapshotsOf(pool.Name) {
		k := s.Namespace + "/" + s.Name
		if s.Namespace != snap.Namespace || s.Name != snap.Name || s.Labels[v1alpha1.LabelRevision] != rev ||
			!sameContent(s, snap) {
			c.log.Warn("revision snapshot not adopted: not the pool's ConfigMap as it is now; nodes that "+
				"run it keep it, undo refuses it",
				zap.String("pool", pool.Name), zap.String("revision", s.Labels[v1alpha1.LabelRevision]), zap.String("configmap", k),
				zap.String("uid", string(s.UID)))
			continue
		}
		c.log.Info("adopted revision snapshot of a pool that recorded none", zap.String("pool", pool.Name),
			zap.String("revision", rev), zap.String("configmap", k), zap.String("uid", string(s.UID)))
		rec = withSnapshot(rec, v1alpha1.RevisionSnapshot{Revision: rev, Namespace: s.Namespace, Name: s.Name, UID: s.UID,
			KubeletConfigKey: pool.Spec.ConfigMap.KubeletConfigKey})
	}
	return rec
}

// sameContent says whether a and b hold the same files, byte for byte.
func sameContent(a, b *corev1.ConfigMap) bool {
	return maps.Equal(a.Data, b.Data) && maps.EqualFunc(a.BinaryData, b.BinaryData, bytes.Equal)
}

// withSnapshot is rec with s as its revision's record, sorted by revision (a stable status).
func withSnapshot(rec *v1alpha1.RevisionSnapshots, s v1alpha1.RevisionSnapshot) *v1alpha1.RevisionSnapshots {
	out := &v1alpha1.RevisionSnapshots{}
	if rec != nil {
		for _, r := range rec.Items {
			if r.Revision != s.Revision {
				out.Items = append(out.Items, r)
			}
		}
	}
	out.Items = append(out.Items, s)
	slices.SortFunc(out.Items, func(a, b v1alpha1.RevisionSnapshot) int { return strings.Compare(a.Revision, b.Revision) })
	return out
}

// keptSnapshots is the record the pool's status keeps: the snapshots that still exist, and those of the
// current and previous revisions and the nodes' own revisions of the current one (targets) whatever the
// cache shows (one just created may not be there yet). A
// pruned or deleted snapshot's record goes with it; the record's size follows revisionHistoryLimit.
func (c *Controller) keptSnapshots(rec *v1alpha1.RevisionSnapshots, st v1alpha1.KubeletConfigPoolStatus,
	targets map[string]bool) *v1alpha1.RevisionSnapshots {
	if rec == nil {
		return nil
	}
	out := &v1alpha1.RevisionSnapshots{}
	for _, r := range rec.Items {
		if r.Revision == st.CurrentRevision || r.Revision == st.PreviousRevision ||
			targets[r.Revision] ||
			c.cachedSnapshot(r.Namespace+"/"+r.Name) != nil {
			out.Items = append(out.Items, r)
		}
	}
	return out
}

// cachedSnapshot is the snapshot cache's object of key ("namespace/name"); nil when there is none, or
// this controller deleted it and has not created it again.
func (c *Controller) cachedSnapshot(key string) *corev1.ConfigMap {
	c.mu.Lock()
	deleted := c.deleted[key]
	c.mu.Unlock()
	ns, _, _ := strings.Cut(key, "/")
	inf, ok := c.snapshots[ns]
	if !ok || deleted {
		return nil
	}
	obj, exists, _ := inf.GetStore().GetByKey(key)
	if !exists {
		return nil
	}
	cm, _ := obj.(*corev1.ConfigMap)
	return cm
}
