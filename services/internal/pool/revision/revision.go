// Package revision names a KubeletConfigPool's config revisions and builds their snapshots: a revision is
// the content of the pool's ConfigMap at one moment, copied into an immutable ConfigMap labelled with the pool and
// nodes are assigned, the way a Deployment's ReplicaSets freeze its pod template. An edit of the pool's
// ConfigMap is then a new revision that reaches nodes batch by batch, instead of an in-place change every
// node using the ConfigMap would pick up at once; undo is the assignment of an earlier snapshot.
//
// Everything here is pure: the controller creates, lists and deletes the objects.
package revision

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// NameLength is the length of a revision's name.
const NameLength = v1alpha1.RevisionNameLength

// Name is the revision of a config (v1alpha1.RevisionName, which kubectl-dkc computes too).
func Name(namespace, kubeletConfigKey string, data map[string]string) string {
	return v1alpha1.RevisionName(namespace, kubeletConfigKey, data)
}

// SnapshotName is the name of pool's snapshot ConfigMap of revision (v1alpha1.SnapshotName).
func SnapshotName(pool, revision string) string { return v1alpha1.SnapshotName(pool, revision) }

// Source is the config source a node is assigned for pool's revision: the snapshot, with the pool's key.
func Source(pool *v1alpha1.KubeletConfigPool, revision string) corev1.ConfigMapNodeConfigSource {
	return corev1.ConfigMapNodeConfigSource{
		Namespace:        pool.Spec.ConfigMap.Namespace,
		Name:             SnapshotName(pool.Name, revision),
		KubeletConfigKey: pool.Spec.ConfigMap.KubeletConfigKey,
	}
}

// AssignedSource is the source the pool's assignment a named: its revision's snapshot in the namespace
// and with the key recorded in a, which the pool's spec may no longer name. A record written before
// Assignment had them is read with the spec's.
func AssignedSource(pool *v1alpha1.KubeletConfigPool, a v1alpha1.Assignment) corev1.ConfigMapNodeConfigSource {
	s := Source(pool, a.Revision)
	if a.Namespace != "" {
		s.Namespace = a.Namespace
	}
	if a.KubeletConfigKey != "" {
		s.KubeletConfigKey = a.KubeletConfigKey
	}
	return s
}

// Snapshot returns the revision of cm (the pool's ConfigMap) and the immutable ConfigMap that freezes it:
// in cm's namespace (one of dkc-server's --config-namespaces, so the service can read it), labelled with
// the pool and the revision.
//
// It has no owner reference: the garbage collector would delete a deleted pool's snapshot that a Node
// still runs (the node would report "failed to download config" forever), and keeping those would need a
// finalizer on the pool, which wedges the CRD's deletion whenever dkc-server is gone. The controller
// deletes a deleted pool's snapshots itself once no Node uses them (docs/design.md, §11).
func Snapshot(pool *v1alpha1.KubeletConfigPool, cm *corev1.ConfigMap) (string, *corev1.ConfigMap) {
	rev := Name(cm.Namespace, pool.Spec.ConfigMap.KubeletConfigKey, cm.Data)
	data := make(map[string]string, len(cm.Data))
	for k, v := range cm.Data {
		data[k] = v
	}
	immutable := true
	return rev, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: cm.Namespace,
			Name:      SnapshotName(pool.Name, rev),
			Labels:    map[string]string{v1alpha1.LabelPool: pool.Name, v1alpha1.LabelRevision: rev},
		},
		Immutable: &immutable,
		Data:      data,
	}
}

// Kept is a pool's revision snapshot as the controller lists it.
type Kept struct {
	Revision string
	Created  time.Time
}

// Prune returns the revisions to delete: all but the newest limit, never the current or previous revision
// nor one a node still uses (inUse: a node's source names it, or its status shows it active or
// last-known-good). Those do not count against the limit: undo always finds the previous revision, and
// dkc-server never loses the ConfigMap a node's source names (it would report "failed to download").
func Prune(kept []Kept, current, previous string, inUse map[string]bool, limit int) []string {
	var candidates []Kept
	for _, k := range kept {
		if k.Revision == current || k.Revision == previous || inUse[k.Revision] {
			continue
		}
		candidates = append(candidates, k)
	}
	// Newest first; equal times by name, so every replica prunes the same ones.
	slices.SortFunc(candidates, func(a, b Kept) int {
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Revision, b.Revision)
	})
	var drop []string
	for i, k := range candidates {
		if i >= max(limit, 0) {
			drop = append(drop, k.Revision)
		}
	}
	return drop
}
