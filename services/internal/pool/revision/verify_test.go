// SPDX-License-Identifier: Apache-2.0

package revision

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

func TestVerify(t *testing.T) {
	data := map[string]string{"kubelet": kubelet}
	rev := Name("kube-system", "kubelet", data)
	name := SnapshotName("p", rev)
	snap := func(edit func(cm *corev1.ConfigMap)) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name, UID: "u1",
				Labels: map[string]string{v1alpha1.LabelPool: "p", v1alpha1.LabelRevision: rev}},
			Data: map[string]string{"kubelet": kubelet},
		}
		if edit != nil {
			edit(cm)
		}
		return cm
	}
	record := func(uid types.UID, key string) *v1alpha1.RevisionSnapshots {
		return &v1alpha1.RevisionSnapshots{Items: []v1alpha1.RevisionSnapshot{
			{Revision: "bcdfghjklm", Namespace: "kube-system", Name: SnapshotName("p", "bcdfghjklm"), UID: "other", KubeletConfigKey: "kubelet"},
			{Revision: rev, Namespace: "kube-system", Name: name, UID: uid, KubeletConfigKey: key},
		}}
	}
	for _, tc := range []struct {
		name string
		cm   *corev1.ConfigMap
		key  string
		rec  *v1alpha1.RevisionSnapshots
		// running: the node already runs the object.
		running bool
		// claimed: Claim finds a pool and revision; want: "" to pass, else a part of the mismatch's detail.
		claimed bool
		want    string
	}{
		{name: "recorded, as created", cm: snap(nil), key: "kubelet", rec: record("u1", "kubelet"), claimed: true},
		{name: "no record: refused", cm: snap(nil), key: "kubelet", claimed: true, want: "pool p records no snapshot of revision " + rev},
		{name: "no record, the node runs it: the data decide", cm: snap(nil), key: "kubelet", claimed: true, running: true},
		{name: "record without the revision: refused", cm: snap(nil), key: "kubelet", rec: &v1alpha1.RevisionSnapshots{}, claimed: true,
			want: "only a node already running it"},
		{name: "record without the revision, the node runs it", cm: snap(nil), key: "kubelet", rec: &v1alpha1.RevisionSnapshots{}, claimed: true,
			running: true},
		{name: "recorded with another UID, the node runs it: refused", cm: snap(nil), key: "kubelet", rec: record("u0", "kubelet"), claimed: true,
			running: true, want: "UID u0"},
		{name: "deleted and created again with the same data", cm: snap(nil), key: "kubelet", rec: record("u0", "kubelet"), claimed: true,
			want: "not the snapshot pool p created for revision " + rev + " (UID u0)"},
		{name: "created again with other data", key: "kubelet", rec: record("u0", "kubelet"), claimed: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.UID = "u2"; cm.Data["kubelet"] += "staticPodPath: /etc/evil\n" }), want: "UID u0"},
		{name: "pre-created with other data, no record", key: "kubelet", claimed: true, running: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.Data["kubelet"] += "staticPodPath: /etc/evil\n" }), want: "its data is revision "},
		{name: "a file added", key: "kubelet", rec: record("u1", "kubelet"), claimed: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.Data["extra"] = "x" }), want: "not " + rev},
		{name: "served with another key than the revision's: the recorded key", cm: snap(nil), key: "other", rec: record("u1", "kubelet"), claimed: true},
		{name: "another key, no record", cm: snap(nil), key: "other", claimed: true, running: true, want: "its data is revision "},
		{name: "labels naming another snapshot", key: "kubelet", claimed: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.Name = "q-" + rev }), want: "whose snapshot is named p-" + rev},
		{name: "created again without labels, other data", key: "kubelet", rec: record("u0", "kubelet"), claimed: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.Labels = nil; cm.UID = "u2"; cm.Data["kubelet"] = "x" }), want: "UID u0"},
		{name: "without labels, recorded UID and data", key: "kubelet", rec: record("u1", "kubelet"), claimed: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.Labels = nil })},
		{name: "without labels, not recorded: an ordinary ConfigMap", key: "kubelet", claimed: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.Labels = nil; cm.Data["kubelet"] = "x" })},
		{name: "recorded in another namespace: an ordinary ConfigMap here", key: "kubelet", rec: record("u0", "kubelet"), claimed: true,
			cm: snap(func(cm *corev1.ConfigMap) { cm.Labels = nil; cm.Namespace = "dkc-configs" })},
		{name: "an ordinary name", key: "kubelet", cm: snap(func(cm *corev1.ConfigMap) { cm.Labels = nil; cm.Name = "my-config" })},
		{name: "only the pool label (a pool's own ConfigMap)", key: "kubelet",
			cm: snap(func(cm *corev1.ConfigMap) {
				delete(cm.Labels, v1alpha1.LabelRevision)
				cm.Name = "my-config"
				cm.Data["kubelet"] = "x"
			})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, rv, ok := Claim(tc.cm)
			if ok != tc.claimed {
				t.Fatalf("Claim = %q %q %v, want claimed %v", pool, rv, ok, tc.claimed)
			}
			if !ok {
				return
			}
			err := Verify(tc.cm, pool, rv, tc.key, tc.rec, tc.running)
			var m *Mismatch
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Verify = %v, want nil", err)
			case tc.want != "" && (!errors.As(err, &m) || !strings.Contains(m.Detail, tc.want)):
				t.Fatalf("Verify = %v, want a mismatch saying %q", err, tc.want)
			case m != nil && (!strings.Contains(err.Error(), tc.cm.Namespace+"/"+tc.cm.Name) || !strings.Contains(err.Error(), string(tc.cm.UID))):
				t.Errorf("Verify = %v: want the ConfigMap and its UID named", err)
			}
		})
	}
}
