// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	poolrecords "github.com/dkc-dev/dkc/services/internal/pool/records"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// records are the pools' snapshot records, over a map; unsynced until the pools are listed.
type records struct {
	pools    map[string]*v1alpha1.RevisionSnapshots
	unsynced bool
	previews []poolrecords.Preview
}

func (r *records) Previews() []poolrecords.Preview { return r.previews }

func (r *records) Recorded(pool string) (*v1alpha1.RevisionSnapshots, bool) {
	rec, ok := r.pools[pool]
	return rec, ok
}
func (r *records) Synced() bool                  { return !r.unsynced }
func (r *records) Run(ctx context.Context) error { <-ctx.Done(); return nil }

// reports puts on the Node the status dkc-server writes when its sidecar reports running uid, and
// resolves the node again.
func (f *fixture) reports(node string, uid types.UID) {
	f.t.Helper()
	f.reportsAssigned(node, uid, uid)
}

// reportsAssigned is reports of a node assigned one object and running another.
func (f *fixture) reportsAssigned(node string, assigned, active types.UID) {
	f.t.Helper()
	obj, ok, err := f.store.GetByKey(node)
	if err != nil || !ok {
		f.t.Fatalf("node %s: %v", node, err)
	}
	n := obj.(*corev1.Node).DeepCopy()
	src := func(uid types.UID) *corev1.NodeConfigSource {
		return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "x", UID: uid}}
	}
	raw, err := json.Marshal(corev1.NodeConfigStatus{Assigned: src(assigned), Active: src(active)})
	if err != nil {
		f.t.Fatal(err)
	}
	n.Annotations[nodeconfig.StatusAnnotation] = string(raw)
	if err := f.store.Update(n); err != nil {
		f.t.Fatal(err)
	}
	f.sync(node)
}

// assignedByPool puts on the Node the dkc.dev/pool-assignment its pool writes when it assigns revision rev
// at time at.
func (f *fixture) assignedByPool(node, pool, rev string, at time.Time) {
	f.t.Helper()
	obj, ok, err := f.store.GetByKey(node)
	if err != nil || !ok {
		f.t.Fatalf("node %s: %v", node, err)
	}
	n := obj.(*corev1.Node).DeepCopy()
	raw, err := json.Marshal(v1alpha1.Assignment{Pool: pool, Revision: rev, Time: metav1.NewTime(at)})
	if err != nil {
		f.t.Fatal(err)
	}
	n.Annotations[v1alpha1.AnnotationAssignment] = string(raw)
	if err := f.store.Update(n); err != nil {
		f.t.Fatal(err)
	}
}

// TestTamperedSnapshotNotServed: a node whose source names a pool's revision snapshot is sent it only
// while its data hash to its revision and its UID is the one the pool records — or, when the pool records
// none, while the node already runs that very object; otherwise the node gets SnapshotMismatchError and
// keeps what it was sent before. Before the pools' records are listed, a snapshot the node does not run
// waits: nothing is sent, no error. (Before the check, every tampered version here was sent; before the
// wait, a snapshot re-created as dkc-server started was sent.)
func TestTamperedSnapshotNotServed(t *testing.T) {
	const kubelet = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 42\n"
	rev := revision.Name("kube-system", "kubelet", map[string]string{"kubelet": kubelet})
	name := revision.SnapshotName("blue", rev)
	key := configmaps.Key("kube-system", name)
	snapshot := func(uid types.UID, rv, data string, lbls bool) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, UID: uid, ResourceVersion: rv},
			Data: map[string]string{"kubelet": data}}
		if lbls {
			cm.Labels = map[string]string{v1alpha1.LabelPool: "blue", v1alpha1.LabelRevision: rev}
		}
		return cm
	}
	recording := func(uid types.UID) map[string]*v1alpha1.RevisionSnapshots {
		return map[string]*v1alpha1.RevisionSnapshots{"blue": {Items: []v1alpha1.RevisionSnapshot{
			{Revision: rev, Namespace: "kube-system", Name: name, UID: uid, KubeletConfigKey: "kubelet"}}}}
	}
	noRecord := map[string]*v1alpha1.RevisionSnapshots{"blue": {}}
	const sent, refused, waits = "sent", "refused", "waits"
	for _, tc := range []struct {
		name    string
		records *records // nil: the controller has no records at all
		then    *corev1.ConfigMap
		want    string
		// listed: the records once the pools are listed, for a case that waits; then sent or refused.
		listed map[string]*v1alpha1.RevisionSnapshots
		after  string
		// assignedAgo: the node's pool assigned it the revision that long ago (0: no pool assignment);
		// assignedRev: the revision it names, if not the snapshot's.
		assignedAgo time.Duration
		assignedRev string
		// createdAgo: then was created that long ago (0: long before).
		createdAgo time.Duration
		// reportsAssigned: the node reports it was assigned this UID (still running u1).
		reportsAssigned types.UID
	}{
		{name: "the recorded snapshot", records: &records{pools: recording("u1")}, then: snapshot("u1", "2", kubelet, true), want: sent},
		{name: "created again with other data", records: &records{pools: recording("u1")}, then: snapshot("u2", "3", kubelet+"staticPodPath: /x\n", true), want: refused},
		{name: "created again with the same data", records: &records{pools: recording("u1")}, then: snapshot("u2", "3", kubelet, true), want: refused},
		{name: "created again without labels", records: &records{pools: recording("u1")}, then: snapshot("u2", "3", "x", false), want: refused},
		{name: "no record (a pool gone, or from before records), the node runs it", records: &records{}, then: snapshot("u1", "2", kubelet, true), want: sent},
		{name: "no record, created again with the same data", records: &records{}, then: snapshot("u2", "3", kubelet, true), want: refused},
		{name: "no record, the node runs it, other data", records: &records{}, then: snapshot("u1", "3", "x", true), want: refused},
		{name: "no records at all, created again", then: snapshot("u2", "3", kubelet, true), want: refused},
		{name: "created again before the pools are listed", records: &records{unsynced: true},
			then: snapshot("u2", "3", kubelet, true), want: waits, listed: recording("u1"), after: refused},
		{name: "a new snapshot before the pools are listed", records: &records{unsynced: true},
			then: snapshot("u2", "3", kubelet, true), want: waits, listed: recording("u2"), after: sent},
		{name: "the snapshot the node runs, before the pools are listed", records: &records{unsynced: true},
			then: snapshot("u1", "2", kubelet, true), want: sent},
		{name: "assigned by its pool a moment ago, its record not seen yet", records: &records{pools: noRecord},
			then: snapshot("u2", "3", kubelet, true), assignedAgo: time.Second, want: waits, listed: recording("u2"), after: sent},
		{name: "assigned by its pool a moment ago, created again: no wait", records: &records{pools: recording("u1")},
			then: snapshot("u2", "3", kubelet, true), assignedAgo: time.Second, want: refused},
		{name: "assigned by its pool long ago, no record of it", records: &records{pools: noRecord},
			then: snapshot("u2", "3", kubelet, true), assignedAgo: time.Minute, want: refused},
		{name: "assigned by its pool a moment ago another revision", records: &records{pools: noRecord},
			then: snapshot("u2", "3", kubelet, true), assignedAgo: time.Second, assignedRev: "bcdfghjklm", want: refused},
		{name: "created a moment ago, the record of its UID not seen yet", records: &records{pools: recording("u1")},
			then: snapshot("u2", "3", kubelet, true), createdAgo: time.Second, want: waits, listed: recording("u2"), after: sent},
		{name: "a pool from before records, not yet adopted", records: &records{pools: map[string]*v1alpha1.RevisionSnapshots{"blue": nil}},
			then: snapshot("u2", "3", kubelet, true), want: waits, listed: recording("u2"), after: sent},
		{name: "the node reports it was assigned the object", records: &records{pools: noRecord},
			then: snapshot("u2", "3", kubelet, true), reportsAssigned: "u2", want: sent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.records != nil {
				f.c.snapshots = tc.records
			}
			// The node ran u1 before this dkc-server started: it is sent again whatever the records say.
			f.cms.cms[key] = snapshot("u1", "1", kubelet, true)
			f.assign("node-1", name)
			f.reports("node-1", "u1")
			first, _, _ := f.table.Get("node-1")
			if first.SyncError != "" || first.Assignment.GetSource().GetConfigMap().GetUid() != "u1" {
				t.Fatalf("the snapshot the node runs: %+v, want it sent", first)
			}
			if tc.assignedAgo > 0 {
				r := rev
				if tc.assignedRev != "" {
					r = tc.assignedRev
				}
				f.assignedByPool("node-1", "blue", r, time.Now().Add(-tc.assignedAgo))
			}
			if tc.reportsAssigned != "" {
				f.reportsAssigned("node-1", tc.reportsAssigned, "u1")
			}
			if tc.createdAgo > 0 {
				tc.then.CreationTimestamp = metav1.NewTime(time.Now().Add(-tc.createdAgo))
			}
			f.cms.cms[key] = tc.then
			f.configMapChanged(key)
			check := func(want string) {
				t.Helper()
				got, _, _ := f.table.Get("node-1")
				uid := got.Assignment.GetSource().GetConfigMap().GetUid()
				switch {
				case want == refused && (got.SyncError != string(nodeconfig.SnapshotMismatchError) || got.Assignment != first.Assignment):
					t.Errorf("sync error %q, sent %s: want %q and the first snapshot kept", got.SyncError, uid, nodeconfig.SnapshotMismatchError)
				case want == waits && (got.SyncError != "" || got.Assignment != first.Assignment):
					t.Errorf("sync error %q, sent %s: want nothing changed", got.SyncError, uid)
				case want == sent && (got.SyncError != "" || uid != string(tc.then.UID)):
					t.Errorf("sync error %q, sent %s: want %s sent", got.SyncError, uid, tc.then.UID)
				}
			}
			check(tc.want)
			if tc.want == waits {
				tc.records.pools, tc.records.unsynced = tc.listed, false
				f.sync("node-1")
				check(tc.after)
			}
		})
	}
}
