// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	poolrecords "github.com/dkc-dev/dkc/services/internal/pool/records"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// TestPreviewAttached: a node a standing preview's selector matches is asked for it, with the snapshot
// resolved as an assignment and shared by every node asked; not a node whose source is that snapshot,
// nor any node when the snapshot is not the recorded one, missing, or unrecorded. Of two matching pools
// the first by name asks.
func TestPreviewAttached(t *testing.T) {
	const kubelet = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 42\n"
	rev := revision.Name("kube-system", "kubelet", map[string]string{"kubelet": kubelet})
	name := revision.SnapshotName("blue", rev)
	key := configmaps.Key("kube-system", name)
	requested := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	snapshot := func(uid types.UID) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, UID: uid, ResourceVersion: "1",
			Labels: map[string]string{v1alpha1.LabelPool: "blue", v1alpha1.LabelRevision: rev}},
			Data: map[string]string{"kubelet": kubelet}}
	}
	record := func(pool string) v1alpha1.RevisionSnapshot {
		return v1alpha1.RevisionSnapshot{Revision: rev, Namespace: "kube-system", Name: revision.SnapshotName(pool, rev),
			UID: types.UID("u1-" + pool), KubeletConfigKey: "kubelet"}
	}
	pv := func(pool string, sel labels.Selector, recorded bool) poolrecords.Preview {
		return poolrecords.Preview{Pool: pool, Revision: rev, RequestTime: requested, Selector: sel, Snapshot: record(pool), Recorded: recorded}
	}
	// amber's snapshot of the same revision, as its pool created it.
	amber := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: revision.SnapshotName("amber", rev),
		UID: "u1-amber", ResourceVersion: "1", Labels: map[string]string{v1alpha1.LabelPool: "amber", v1alpha1.LabelRevision: rev}},
		Data: map[string]string{"kubelet": kubelet}}
	workers := labels.SelectorFromSet(labels.Set{"role": "worker"})
	for _, tc := range []struct {
		name     string
		previews []poolrecords.Preview
		cm       *corev1.ConfigMap
		wantPool string // "" : no preview for the worker nodes
	}{
		{name: "the recorded snapshot", previews: []poolrecords.Preview{pv("blue", workers, true)}, cm: snapshot("u1-blue"), wantPool: "blue"},
		{name: "first pool by name", previews: []poolrecords.Preview{pv("amber", workers, true), pv("blue", workers, true)},
			cm: snapshot("u1-blue"), wantPool: "amber"},
		{name: "first pool by name whose selector matches", previews: []poolrecords.Preview{pv("amber", labels.Nothing(), true),
			pv("blue", workers, true)}, cm: snapshot("u1-blue"), wantPool: "blue"},
		{name: "selector matches nothing", previews: []poolrecords.Preview{pv("blue", labels.Nothing(), true)}, cm: snapshot("u1-blue")},
		{name: "created again", previews: []poolrecords.Preview{pv("blue", workers, true)}, cm: snapshot("u2")},
		{name: "missing", previews: []poolrecords.Preview{pv("blue", workers, true)}},
		{name: "not recorded", previews: []poolrecords.Preview{pv("blue", workers, false)}, cm: snapshot("u1-blue")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			recs := &records{pools: map[string]*v1alpha1.RevisionSnapshots{
				"blue": {Items: []v1alpha1.RevisionSnapshot{record("blue")}}, "amber": {Items: []v1alpha1.RevisionSnapshot{record("amber")}}}}
			f.c.snapshots = recs
			f.cms.cms[configmaps.Key("kube-system", amber.Name)] = amber
			if tc.cm != nil {
				f.cms.cms[key] = tc.cm
			}
			f.putConfigMap("a", "1")
			for _, n := range []string{"node-1", "node-2", "node-3"} {
				f.assign(n, "a")
			}
			f.assign("node-4", name) // runs the snapshot itself
			f.assign("other", "a")
			for _, n := range []string{"node-1", "node-2", "node-3", "node-4"} {
				f.label(n, map[string]string{"role": "worker"})
			}
			recs.previews = tc.previews
			f.c.onPreviewChange("blue")
			f.syncAll()
			first, _, _ := f.table.Get("node-1")
			if got := first.Preview.GetPool(); got != tc.wantPool {
				t.Fatalf("node-1 preview of pool %q, want %q", got, tc.wantPool)
			}
			if tc.wantPool != "" {
				p := first.Preview
				if p.GetRevision() != rev || !p.GetRequestTime().AsTime().Equal(requested) ||
					p.GetAssignment().GetSource().GetConfigMap().GetUid() != "u1-"+tc.wantPool || p.GetAssignment().GetContentHash() == "" {
					t.Errorf("preview %v, want revision %s requested %v of snapshot u1-%s", p, rev, requested, tc.wantPool)
				}
				if f.cms.byNode[previewHolder("blue")] != key && tc.wantPool == "blue" {
					t.Errorf("tracker holds %q for the preview, want %s", f.cms.byNode[previewHolder("blue")], key)
				}
			}
			for _, n := range []string{"node-2", "node-3"} {
				if st, _, _ := f.table.Get(n); st.Preview != first.Preview {
					t.Errorf("%s preview %p, want node-1's shared %p", n, st.Preview, first.Preview)
				}
			}
			if st, _, _ := f.table.Get("other"); st.Preview != nil {
				t.Errorf("unselected node asked for preview %v", st.Preview)
			}
			if st, _, _ := f.table.Get("node-4"); tc.wantPool == "blue" && st.Preview != nil {
				t.Errorf("node running the snapshot asked to preview it: %v", st.Preview)
			}
			// The preview completes: no node is asked any more, and the tracker lets the snapshot go.
			recs.previews = nil
			f.c.onPreviewChange("blue")
			f.syncAll()
			if st, _, _ := f.table.Get("node-1"); st.Preview != nil {
				t.Errorf("after completion node-1 still asked for %v", st.Preview)
			}
			if _, held := f.cms.byNode[previewHolder("blue")]; held {
				t.Errorf("tracker still holds the completed preview's snapshot")
			}
		})
	}
}

// label sets the node's labels and resolves it again.
func (f *fixture) label(node string, lbls map[string]string) {
	f.t.Helper()
	obj, ok, err := f.store.GetByKey(node)
	if err != nil || !ok {
		f.t.Fatalf("node %s: %v", node, err)
	}
	n := obj.(*corev1.Node).DeepCopy()
	n.Labels = lbls
	if err := f.store.Update(n); err != nil {
		f.t.Fatal(err)
	}
	f.sync(node)
}

// syncAll resolves every node the queue holds, as the workers would.
func (f *fixture) syncAll() {
	f.t.Helper()
	for f.c.queue.Len() > 0 {
		n, _ := f.c.queue.Get()
		f.sync(n)
		f.c.queue.Done(n)
	}
}
