package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// records are the pools' snapshot records, over a map.
type records map[string]*v1alpha1.RevisionSnapshots

func (r records) Recorded(pool string) *v1alpha1.RevisionSnapshots { return r[pool] }
func (r records) Run(ctx context.Context) error                    { <-ctx.Done(); return nil }

// TestTamperedSnapshotNotServed: a node whose source names a pool's revision snapshot is sent it only
// while its data hash to its revision and its UID is the one the pool records; otherwise the node gets
// SnapshotMismatchError and keeps what it was sent before. (Before the check, every tampered version
// here was sent.)
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
	recorded := records{"blue": {Items: []v1alpha1.RevisionSnapshot{
		{Revision: rev, Namespace: "kube-system", Name: name, UID: "u1", KubeletConfigKey: "kubelet"}}}}
	for _, tc := range []struct {
		name    string
		records records
		then    *corev1.ConfigMap
		refused bool
	}{
		{name: "the recorded snapshot", records: recorded, then: snapshot("u1", "2", kubelet, true)},
		{name: "created again with other data", records: recorded, then: snapshot("u2", "3", kubelet+"staticPodPath: /x\n", true), refused: true},
		{name: "created again with the same data", records: recorded, then: snapshot("u2", "3", kubelet, true), refused: true},
		{name: "created again without labels", records: recorded, then: snapshot("u2", "3", "x", false), refused: true},
		{name: "no record (a pool gone, or from before records): the data decide", records: records{}, then: snapshot("u2", "3", kubelet, true)},
		{name: "no record, other data", records: records{}, then: snapshot("u2", "3", "x", true), refused: true},
		{name: "no records at all, other data", then: snapshot("u2", "3", "x", true), refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.records != nil {
				f.c.snapshots = tc.records
			}
			f.cms.cms[key] = snapshot("u1", "1", kubelet, true)
			f.assign("node-1", name)
			first, _, _ := f.table.Get("node-1")
			if first.SyncError != "" || first.Assignment.GetSource().GetConfigMap().GetUid() != "u1" {
				t.Fatalf("the recorded snapshot: %+v, want it sent", first)
			}
			f.cms.cms[key] = tc.then
			f.configMapChanged(key)
			got, _, _ := f.table.Get("node-1")
			switch {
			case tc.refused && (got.SyncError != string(nodeconfig.SnapshotMismatchError) || got.Assignment != first.Assignment):
				t.Errorf("sync error %q, sent %s: want %q and the first snapshot kept", got.SyncError,
					got.Assignment.GetSource().GetConfigMap().GetUid(), nodeconfig.SnapshotMismatchError)
			case !tc.refused && (got.SyncError != "" || got.Assignment.GetSource().GetConfigMap().GetUid() != string(tc.then.UID)):
				t.Errorf("sync error %q, sent %s: want %s sent", got.SyncError, got.Assignment.GetSource().GetConfigMap().GetUid(), tc.then.UID)
			}
		})
	}
}
