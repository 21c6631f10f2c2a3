// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// recordedSnapshot puts the snapshot of cm's revision where the controller finds it created and recorded
// before: in the API and the snapshot cache, and in the cached pool's record.
func (h *harness) recordedSnapshot(t *testing.T, pool *v1alpha1.KubeletConfigPool, cm *corev1.ConfigMap) *corev1.ConfigMap {
	t.Helper()
	rev, snap := revision.Snapshot(pool, cm)
	snap.UID = "snap-uid"
	h.addSnapshot(t, snap)
	p := pool.DeepCopy()
	p.Status.RevisionSnapshots = &v1alpha1.RevisionSnapshots{Items: []v1alpha1.RevisionSnapshot{
		{Revision: rev, Namespace: snap.Namespace, Name: snap.Name, UID: snap.UID, KubeletConfigKey: pool.Spec.ConfigMap.KubeletConfigKey}}}
	if err := h.c.pools.GetStore().Update(p); err != nil {
		t.Fatal(err)
	}
	return snap
}

// addSnapshot puts cm in the API and in the snapshot cache.
func (h *harness) addSnapshot(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	if _, err := h.client.CoreV1().ConfigMaps(cm.Namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if cm.Labels[v1alpha1.LabelPool] != "" {
		if err := h.c.snapshots[cm.Namespace].GetStore().Add(cm); err != nil {
			t.Fatal(err)
		}
	}
}

// uids makes the fake clientset give created ConfigMaps a UID, as the apiserver does.
func uids(h *harness) {
	var n atomic.Int32
	h.client.PrependReactor("create", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		cm := a.(k8stesting.CreateAction).GetObject().(*corev1.ConfigMap)
		if cm.UID == "" {
			cm.UID = types.UID(fmt.Sprintf("created-%d", n.Add(1)))
		}
		return false, nil, nil
	})
}

// TestEnsureSnapshot: the controller assigns a revision only through the snapshot it created and recorded;
// any other object of the snapshot's name is refused with ConfigInvalid SnapshotMismatch, an Event, and no
// assignment. (Before the record, every case here assigned node a.)
func TestEnsureSnapshot(t *testing.T) {
	good := map[string]string{"kubelet": goodConfig}
	evil := map[string]string{"kubelet": goodConfig + "staticPodPath: /etc/evil\n"}
	pool := testPool()
	rev, want := revision.Snapshot(pool, configMap(good))
	legacy := func(p *v1alpha1.KubeletConfigPool) { p.Status.CurrentRevision = rev }
	record := func(uid types.UID) func(p *v1alpha1.KubeletConfigPool) {
		return func(p *v1alpha1.KubeletConfigPool) {
			p.Status.CurrentRevision = rev
			p.Status.RevisionSnapshots = &v1alpha1.RevisionSnapshots{Items: []v1alpha1.RevisionSnapshot{
				{Revision: rev, Namespace: "kube-system", Name: want.Name, UID: uid, KubeletConfigKey: "kubelet"}}}
		}
	}
	object := func(uid types.UID, data map[string]string, edit func(*corev1.ConfigMap)) *corev1.ConfigMap {
		cm := want.DeepCopy()
		cm.UID, cm.Data = uid, data
		if edit != nil {
			edit(cm)
		}
		return cm
	}
	for _, tc := range []struct {
		name     string
		pool     func(*v1alpha1.KubeletConfigPool) // the stored status
		existing *corev1.ConfigMap                 // an object of the snapshot's name before the sync
		// refused: a part of the SnapshotMismatch message; "" for a snapshot the controller uses.
		refused string
		// recorded: the UID the stored record must name for the revision afterwards.
		recorded types.UID
	}{
		{name: "a new pool creates and records its snapshot", recorded: "created-1"},
		{name: "pre-created with other data before the pool", existing: object("foreign", evil, nil),
			refused: "configmap kube-system/" + want.Name + " (UID foreign): not created by pool blue: the pool records no snapshot of revision " + rev + "; its data is revision "},
		{name: "pre-created with the same data before the pool", existing: object("foreign", good, nil),
			refused: "(UID foreign): not created by pool blue: the pool records no snapshot"},
		{name: "pre-created without labels", existing: object("foreign", evil, func(cm *corev1.ConfigMap) { cm.Labels = nil }),
			refused: "(UID foreign): not created by pool blue"},
		{name: "recorded: used as it is", pool: record("u1"), existing: object("u1", good, nil), recorded: "u1"},
		{name: "deleted and created again with other data", pool: record("u1"), existing: object("u2", evil, nil),
			refused: "(UID u2): not created by pool blue: the pool records UID u1 for revision " + rev},
		{name: "deleted and created again with the same data", pool: record("u1"), existing: object("u2", good, nil),
			refused: "the pool records UID u1"},
		{name: "recorded UID, other data (an edit of a mutable object)", pool: record("u1"),
			existing: object("u1", evil, func(cm *corev1.ConfigMap) { cm.Immutable = nil }), refused: "its data is revision "},
		{name: "deleted: created again and recorded", pool: record("u1"), recorded: "created-1"},
		{name: "a status from before the record adopts its snapshot", pool: legacy, existing: object("old", good, nil), recorded: "old"},
		{name: "a status from before the record does not adopt other data", pool: legacy, existing: object("old", evil, nil),
			refused: "the pool records no snapshot of revision " + rev},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPool()
			if tc.pool != nil {
				tc.pool(p)
			}
			h := newHarness(t, p, configMap(good), node("a", nil, nil))
			uids(h)
			if tc.existing != nil {
				h.addSnapshot(t, tc.existing)
			}
			if _, err := h.c.sync(context.Background(), "blue"); err != nil {
				t.Fatalf("sync: %v", err)
			}
			last := h.pools.updates[len(h.pools.updates)-1]
			cond := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionConfigInvalid)
			if tc.refused != "" {
				if got := h.assigned(); len(got) != 0 {
					t.Errorf("assigned %v through a refused snapshot", got)
				}
				if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != v1alpha1.ReasonSnapshotMismatch ||
					!strings.Contains(cond.Message, tc.refused) {
					t.Fatalf("ConfigInvalid %+v, want True %s saying %q", cond, v1alpha1.ReasonSnapshotMismatch, tc.refused)
				}
				select {
				case e := <-h.recorder.Events:
					if !strings.Contains(e, EventConfigInvalid) || !strings.Contains(e, v1alpha1.ReasonSnapshotMismatch) {
						t.Errorf("event %q, want %s %s", e, EventConfigInvalid, v1alpha1.ReasonSnapshotMismatch)
					}
				default:
					t.Error("no event")
				}
				got, err := h.client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), want.Name, metav1.GetOptions{})
				if err != nil || got.UID != tc.existing.UID {
					t.Errorf("the refused object was replaced or deleted: %v %v", got, err)
				}
				return
			}
			if got := h.assigned(); len(got) != 1 {
				t.Errorf("assigned %v, want node a", got)
			}
			if cond != nil && cond.Status == metav1.ConditionTrue {
				t.Errorf("ConfigInvalid %+v", cond)
			}
			// The record was stored before the node was assigned: its write comes first.
			first := h.pools.updates[0]
			if r, ok := first.Status.RevisionSnapshots.Snapshot(rev); !ok || r.UID != tc.recorded || r.Name != want.Name || r.KubeletConfigKey != "kubelet" {
				t.Errorf("first status write records %+v, want %s with UID %s", first.Status.RevisionSnapshots, rev, tc.recorded)
			}
			if r, ok := last.Status.RevisionSnapshots.Snapshot(rev); !ok || r.UID != tc.recorded {
				t.Errorf("last status write records %+v, want UID %s", last.Status.RevisionSnapshots, tc.recorded)
			}
		})
	}
}

// TestAdoptOnlyTheConfigMapAsItIs: a pool whose status predates the record adopts only the snapshot of
// the revision its ConfigMap holds now, whose data are the ConfigMap's byte for byte. An earlier
// revision's snapshot has nothing left to compare with, so it stays unrecorded, however its data hash.
// (Before, every snapshot whose data hashed to its revision was adopted.)
func TestAdoptOnlyTheConfigMapAsItIs(t *testing.T) {
	now := map[string]string{"kubelet": goodConfig}
	before := map[string]string{"kubelet": goodConfig + "maxPods: 50\n"}
	p := testPool()
	rev, current := revision.Snapshot(p, configMap(now))
	old, earlier := revision.Snapshot(p, configMap(before))
	p.Status.CurrentRevision, p.Status.PreviousRevision = rev, old
	h := newHarness(t, p, configMap(now), node("a", nil, nil))
	current.UID, earlier.UID = "current", "earlier"
	h.addSnapshot(t, current)
	h.addSnapshot(t, earlier)
	if _, err := h.c.sync(context.Background(), "blue"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	rec := h.pools.updates[0].Status.RevisionSnapshots
	if r, ok := rec.Snapshot(rev); !ok || r.UID != "current" {
		t.Errorf("record %+v: want revision %s adopted with UID current", rec, rev)
	}
	if r, ok := rec.Snapshot(old); ok {
		t.Errorf("record %+v: the earlier revision %s adopted (%+v); want it left unrecorded", rec, old, r)
	}
}
