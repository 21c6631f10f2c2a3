// SPDX-License-Identifier: Apache-2.0

// Package revision names a KubeletConfigPool's config revisions and builds their snapshots: a revision is
// the content of the pool's ConfigMap at one moment, copied into an immutable ConfigMap labelled with the pool and
// nodes are assigned, the way a Deployment's ReplicaSets freeze its pod template. An edit of the pool's
// ConfigMap is then a new revision that reaches nodes batch by batch, instead of an in-place change every
// node using the ConfigMap would pick up at once; undo is the assignment of an earlier snapshot.
//
// Everything here is pure: the controller creates, lists and deletes the objects.
package revision

import (
	"fmt"
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

// NodeSnapshot returns the revision of data — a node's own config computed from the pool's revision base
// (spec.perNode) — and the immutable ConfigMap that freezes it, as Snapshot does for the pool's ConfigMap:
// in namespace, labelled with the pool, the revision and base (v1alpha1.LabelBaseRevision). A node whose
// values leave its config as base is its own revision base, with base's snapshot.
func NodeSnapshot(pool *v1alpha1.KubeletConfigPool, namespace, base string,
	data map[string]string) (string, *corev1.ConfigMap) {
	rev, snap := Snapshot(pool, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace}, Data: data})
	if rev != base {
		snap.Labels[v1alpha1.LabelBaseRevision] = base
	}
	return rev, snap
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

// Claim returns the pool and revision cm is a snapshot of, if it claims to be one: by its labels
// (dkc.dev/pool and dkc.dev/revision), or else by a name of the form <pool>-<revision>, which Verify
// checks against the pool's record only. An object deleted and created again without the labels still
// takes the place of the snapshot a node's source names.
func Claim(cm *corev1.ConfigMap) (pool, rev string, ok bool) {
	if labelled(cm) {
		return cm.Labels[v1alpha1.LabelPool], cm.Labels[v1alpha1.LabelRevision], true
	}
	i := strings.LastIndexByte(cm.Name, '-')
	if i <= 0 || len(cm.Name)-i-1 != NameLength {
		return "", "", false
	}
	return cm.Name[:i], cm.Name[i+1:], true
}

func labelled(cm *corev1.ConfigMap) bool {
	return cm.Labels[v1alpha1.LabelPool] != "" && cm.Labels[v1alpha1.LabelRevision] != ""
}

// Mismatch is a snapshot that must not be used as its revision; Detail says what differs, for a log
// line or a pool condition.
type Mismatch struct {
	Namespace, Name string
	UID             string
	Detail          string
}

func (m *Mismatch) Error() string {
	return fmt.Sprintf("configmap %s/%s (UID %s): %s", m.Namespace, m.Name, m.UID, m.Detail)
}

// Verify says whether cm may be used as pool's revision rev (Claim's result), with kubeletConfigKey key
// (the one a node's source names, or the pool's): nil if it may, a *Mismatch if not. rec is what the pool
// records (nil: the pool is gone, or its status predates the record). running says the node it is for
// already runs this very object: the status dkc-server wrote for it names cm's UID.
//
//   - A labelled snapshot must be named for its pool and revision and its data must hash to the revision,
//     with key or with the key the pool recorded for it: its content is then the revision's, byte for byte.
//   - When the pool records the revision, the object must be the one recorded: same namespace and UID.
//     An object of that name with another UID was created by someone else, or deleted and created again.
//   - When it does not (the pool is gone, its status predates the record, or someone else created the
//     object), a labelled snapshot is used only for a node already running it: the revision's name is a
//     short digest that anyone able to create the object could match with other data, so it decides
//     nothing on its own; a node that runs the object is not sent anything new by using it.
//
// A ConfigMap that only its name makes look like a snapshot, of a revision the pool does not record in its
// namespace, is not one: it may be used.
func Verify(cm *corev1.ConfigMap, pool, rev, key string, rec *v1alpha1.RevisionSnapshots, running bool) error {
	mismatch := func(format string, args ...any) error {
		return &Mismatch{Namespace: cm.Namespace, Name: cm.Name, UID: string(cm.UID), Detail: fmt.Sprintf(format, args...)}
	}
	r, recorded := rec.Snapshot(rev)
	recorded = recorded && r.Namespace == cm.Namespace && r.Name == cm.Name
	if !labelled(cm) && !recorded {
		return nil
	}
	if want := SnapshotName(pool, rev); cm.Name != want {
		return mismatch("labelled pool %q revision %q, whose snapshot is named %s", pool, rev, want)
	}
	if recorded && r.UID != cm.UID {
		return mismatch("not the snapshot pool %s created for revision %s (UID %s): created by someone "+
			"else, or deleted and created again",
			pool, rev, r.UID)
	}
	if !recorded && !running {
		return mismatch("pool %s records no snapshot of revision %s (the pool does not exist, or did not create this "+
			"object): only a node already running it is served it", pool, rev)
	}
	if got, ok := hashesTo(cm, rev, key, r.KubeletConfigKey); !ok {
		return mismatch("its data is revision %s, not %s: not the content the revision names", got, rev)
	}
	return nil
}

// hashesTo says whether cm's data is revision rev with one of keys; got is its revision with the first.
func hashesTo(cm *corev1.ConfigMap, rev string, keys ...string) (got string, ok bool) {
	for i, k := range keys {
		if k == "" || (i > 0 && k == keys[0]) {
			continue
		}
		h := Name(cm.Namespace, k, cm.Data)
		if h == rev {
			return h, true
		}
		if got == "" {
			got = h
		}
	}
	return got, false
}
