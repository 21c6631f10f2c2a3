// SPDX-License-Identifier: Apache-2.0

package revision

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

const kubelet = "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nmaxPods: 90\n"

func TestName(t *testing.T) {
	base := Name("kube-system", "kubelet", map[string]string{"kubelet": kubelet, "notes": "x"})
	// A revision names snapshots on every replica and after upgrades: its value is part of the contract
	// (a change renames every pool's snapshots and reassigns every node).
	if base != wantBase {
		t.Errorf("Name = %q, want %q: the hash changed", base, wantBase)
	}
	if len(base) != NameLength || len(validation.IsDNS1123Label(base)) > 0 {
		t.Errorf("Name = %q: want a DNS label of %d characters", base, NameLength)
	}
	for _, tc := range []struct {
		name string
		ns   string // default kube-system
		key  string
		data map[string]string
		same bool
	}{
		{name: "same content, built in another order", key: "kubelet", data: map[string]string{"notes": "x", "kubelet": kubelet}, same: true},
		{name: "a value edited", key: "kubelet", data: map[string]string{"kubelet": kubelet + "# edited\n", "notes": "x"}},
		{name: "another file edited", key: "kubelet", data: map[string]string{"kubelet": kubelet, "notes": "y"}},
		{name: "a file added", key: "kubelet", data: map[string]string{"kubelet": kubelet, "notes": "x", "more": ""}},
		{name: "another key is the config", key: "notes", data: map[string]string{"kubelet": kubelet, "notes": "x"}},
		{name: "same content in another namespace", ns: "dkc-configs", key: "kubelet", data: map[string]string{"kubelet": kubelet, "notes": "x"}},
		{name: "bytes moved from the namespace to the key", ns: "kube-systemk", key: "ubelet", data: map[string]string{"kubelet": kubelet, "notes": "x"}},
		{name: "bytes moved from a value to a name", key: "kubelet", data: map[string]string{"kubelet": kubelet, "notesx": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.ns
			if ns == "" {
				ns = "kube-system"
			}
			if got := Name(ns, tc.key, tc.data); (got == base) != tc.same {
				t.Errorf("Name = %q, base %q: same = %v, want %v", got, base, got == base, tc.same)
			}
		})
	}
}

// wantBase is TestName's base revision, pinned.
const wantBase = "87qll5fm9r"

func testPool() *v1alpha1.KubeletConfigPool {
	return &v1alpha1.KubeletConfigPool{
		ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("p", 63), UID: "pool-uid"},
		Spec: v1alpha1.KubeletConfigPoolSpec{
			ConfigMap: v1alpha1.ConfigMapReference{Namespace: "kube-system", Name: "blue-config", KubeletConfigKey: "kubelet"},
		},
	}
}

func TestSnapshot(t *testing.T) {
	pool := testPool()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "blue-config", UID: "cm-uid", ResourceVersion: "12",
			Labels: map[string]string{"team": "a"}},
		Data:       map[string]string{"kubelet": kubelet},
		BinaryData: map[string][]byte{"blob": {1}},
	}
	rev, snap := Snapshot(pool, cm)
	if rev != Name("kube-system", "kubelet", cm.Data) {
		t.Errorf("revision %q, want Name of the data", rev)
	}
	if snap.Namespace != "kube-system" || snap.Name != pool.Name+"-"+rev {
		t.Errorf("snapshot %s/%s, want kube-system/%s-%s", snap.Namespace, snap.Name, pool.Name, rev)
	}
	if errs := validation.IsDNS1123Subdomain(snap.Name); len(errs) > 0 {
		t.Errorf("snapshot name %q of the longest pool name: %v", snap.Name, errs)
	}
	if snap.Immutable == nil || !*snap.Immutable {
		t.Error("snapshot not immutable")
	}
	if snap.Labels[v1alpha1.LabelPool] != pool.Name || snap.Labels[v1alpha1.LabelRevision] != rev || len(snap.Labels) != 2 {
		t.Errorf("labels %v, want the pool and the revision only", snap.Labels)
	}
	for _, v := range snap.Labels {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label value %q: %v", v, errs)
		}
	}
	if len(snap.OwnerReferences) != 0 || len(snap.Finalizers) != 0 {
		t.Errorf("owner references %v, finalizers %v: the controller, not the garbage collector, deletes snapshots",
			snap.OwnerReferences, snap.Finalizers)
	}
	if len(snap.BinaryData) != 0 || snap.Data["kubelet"] != kubelet || len(snap.Data) != 1 {
		t.Errorf("data %v binaryData %v, want the data only", snap.Data, snap.BinaryData)
	}
	snap.Data["kubelet"] = "changed"
	if cm.Data["kubelet"] != kubelet {
		t.Error("the snapshot shares its data map with the ConfigMap")
	}
	src := Source(pool, rev)
	if src.Namespace != snap.Namespace || src.Name != snap.Name || src.KubeletConfigKey != "kubelet" || src.UID != "" || src.ResourceVersion != "" {
		t.Errorf("source %+v, want the snapshot with the pool's key, unresolved", src)
	}
}

func TestPrune(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 11, 26, h, 0, 0, 0, time.UTC) }
	kept := []Kept{{"r1", at(1)}, {"r2", at(2)}, {"r3", at(3)}, {"r4", at(4)}, {"r5", at(5)}, {"r6", at(6)}}
	for _, tc := range []struct {
		name  string
		inUse map[string]bool
		limit int
		want  string
	}{
		{name: "keeps current, previous and the newest limit", limit: 2, want: "r2,r1"},
		{name: "limit 0 keeps current and previous", limit: 0, want: "r4,r3,r2,r1"},
		{name: "a revision a node uses is kept beyond the limit", limit: 1, inUse: map[string]bool{"r1": true}, want: "r3,r2"},
		{name: "nothing beyond the limit", limit: 10, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(Prune(kept, "r6", "r5", tc.inUse, tc.limit), ",")
			if got != tc.want {
				t.Errorf("Prune = %q, want %q", got, tc.want)
			}
		})
	}
}
