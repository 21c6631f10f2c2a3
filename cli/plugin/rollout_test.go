// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	poolfake "github.com/dkc-dev/dkc/api/generated/clientset/fake"
	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// TestSnapshotForUndo: undo takes a pool's revision only where the pool's snapshots live and only when it
// is the revision's snapshot as the pool recorded it. (Before, a ConfigMap of the snapshot's labels in any
// namespace was taken, and its data never checked; then one the pool did not record was taken on its data.)
func TestSnapshotForUndo(t *testing.T) {
	data := map[string]string{"kubelet": "kind: KubeletConfiguration\n"}
	rev := v1alpha1.RevisionName("kube-system", "kubelet", data)
	moved := v1alpha1.RevisionName("configs", "kubelet", data)
	snap := func(ns, rev string, uid types.UID, data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.SnapshotName("blue", rev), UID: uid,
			Labels: map[string]string{v1alpha1.LabelPool: "blue", v1alpha1.LabelRevision: rev}}, Data: data}
	}
	pool := func(rec ...v1alpha1.RevisionSnapshot) *v1alpha1.KubeletConfigPool {
		p := &v1alpha1.KubeletConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"}, Spec: v1alpha1.KubeletConfigPoolSpec{
			ConfigMap: v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "blue-config", KubeletConfigKey: "kubelet"}}}
		if rec != nil {
			p.Status.RevisionSnapshots = &v1alpha1.RevisionSnapshots{Items: rec}
		}
		return p
	}
	recorded := func(ns, rev string, uid types.UID) v1alpha1.RevisionSnapshot {
		return v1alpha1.RevisionSnapshot{Revision: rev, Namespace: ns, Name: v1alpha1.SnapshotName("blue", rev), UID: uid, KubeletConfigKey: "kubelet"}
	}
	evil := map[string]string{"kubelet": "kind: KubeletConfiguration\nstaticPodPath: /x\n"}
	for _, tc := range []struct {
		name    string
		pool    *v1alpha1.KubeletConfigPool
		objects []*corev1.ConfigMap
		rev     string
		want    string // "" found; else a part of the error
	}{
		{name: "in the pool's namespace, not recorded", pool: pool(), objects: []*corev1.ConfigMap{snap("kube-system", rev, "u1", data)}, rev: rev,
			want: "(UID u1) is not revision " + rev + " of kubeletconfigpool blue: the pool records no snapshot of that revision"},
		{name: "recorded", pool: pool(recorded("kube-system", rev, "u1")), objects: []*corev1.ConfigMap{snap("kube-system", rev, "u1", data)}, rev: rev},
		{name: "recorded in the namespace the spec named before", pool: pool(recorded("configs", moved, "u1")),
			objects: []*corev1.ConfigMap{snap("configs", moved, "u1", data)}, rev: moved},
		{name: "elsewhere, not recorded: not searched", pool: pool(), objects: []*corev1.ConfigMap{snap("default", moved, "u1", data)}, rev: moved,
			want: "has no revision " + moved + " in namespace kube-system"},
		{name: "other data", pool: pool(recorded("kube-system", rev, "u2")), objects: []*corev1.ConfigMap{snap("kube-system", rev, "u2", evil)}, rev: rev,
			want: "(UID u2) is not revision " + rev + " of kubeletconfigpool blue: its data is revision"},
		{name: "created again", pool: pool(recorded("kube-system", rev, "u1")), objects: []*corev1.ConfigMap{snap("kube-system", rev, "u2", data)}, rev: rev,
			want: "the pool records kube-system/blue-" + rev + " with UID u1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			for _, cm := range tc.objects {
				if _, err := client.CoreV1().ConfigMaps(cm.Namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			o := &Options{client: client}
			got, err := o.snapshot(context.Background(), tc.pool, tc.rev)
			switch {
			case tc.want == "" && (err != nil || got == nil):
				t.Fatalf("snapshot: %v, want it found", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("snapshot: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestModifyPoolRetriesOnConflict: a pool the controller's status write changed meanwhile is read and
// changed again; the write names kubectl-dkc, leaves the status out, and the pool returned carries its kind.
func TestModifyPoolRetriesOnConflict(t *testing.T) {
	stored := &v1alpha1.KubeletConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"},
		Status: v1alpha1.KubeletConfigPoolStatus{CurrentRevision: "a"}}
	pools := poolfake.NewSimpleClientset(stored)
	var updates []k8stesting.UpdateActionImpl
	pools.PrependReactor("update", v1alpha1.PoolResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		up := a.(k8stesting.UpdateActionImpl)
		updates = append(updates, up)
		if len(updates) == 1 {
			return true, nil, apierrors.NewConflict(v1alpha1.Resource(v1alpha1.PoolResource), "blue", errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	o := &Options{pools: pools}
	reads := 0
	got, err := o.modifyPool(context.Background(), "blue", func(p *v1alpha1.KubeletConfigPool) error {
		reads++
		p.Spec.Retry++
		return nil
	})
	if err != nil {
		t.Fatalf("modifyPool: %v", err)
	}
	if reads != 2 || len(updates) != 2 {
		t.Errorf("read %d times, wrote %d times: want 2 each (one Conflict)", reads, len(updates))
	}
	if got.Spec.Retry != 1 || got.Kind != "KubeletConfigPool" || got.APIVersion != "dkc.dev/v1alpha1" {
		t.Errorf("returned retry %d, kind %q %q: want retry 1 of a dkc.dev/v1alpha1 KubeletConfigPool", got.Spec.Retry, got.APIVersion, got.Kind)
	}
	for _, up := range updates {
		sent := up.GetObject().(*v1alpha1.KubeletConfigPool)
		if up.GetSubresource() != "" || up.UpdateOptions.FieldManager != fieldManager || sent.Status.CurrentRevision != "" {
			t.Errorf("wrote subresource %q as %q with status %+v: want the pool, as %q, without its status",
				up.GetSubresource(), up.UpdateOptions.FieldManager, sent.Status, fieldManager)
		}
	}
}

// TestPoolError: a pool that does not exist is named; a cluster without the CRD is told what to install.
func TestPoolError(t *testing.T) {
	for _, tc := range []struct {
		name  string
		noCRD bool
		want  string
	}{
		{name: "no such pool", want: `kubeletconfigpool green: kubeletconfigpools.dkc.dev "green" not found`},
		{name: "no CRD", noCRD: true, want: "kubeletconfigpools are not served by this cluster (is dkc's CRD installed?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pools := poolfake.NewSimpleClientset()
			if tc.noCRD {
				pools.PrependReactor("get", v1alpha1.PoolResource, func(k8stesting.Action) (bool, runtime.Object, error) {
					// The apiserver's answer for a resource it does not serve: a NotFound naming nothing.
					return true, nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404,
						Reason: metav1.StatusReasonNotFound, Message: "the server could not find the requested resource"}}
				})
			}
			o := &Options{pools: pools}
			_, err := o.getPool(context.Background(), "green")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !apierrors.IsNotFound(err) {
				t.Errorf("getPool: %v, want a NotFound saying %q", err, tc.want)
			}
		})
	}
}
