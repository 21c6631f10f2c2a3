package records

import (
	"slices"
	"testing"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

func pool(items ...v1alpha1.RevisionSnapshot) *v1alpha1.KubeletConfigPool {
	p := &v1alpha1.KubeletConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"}}
	if items != nil {
		p.Status.RevisionSnapshots = &v1alpha1.RevisionSnapshots{Items: items}
	}
	return p
}

// TestChanged: the nodes of a snapshot are resolved again when its record appears, changes or goes, and
// only then.
func TestChanged(t *testing.T) {
	a := v1alpha1.RevisionSnapshot{Revision: "a", Namespace: "kube-system", Name: "blue-a", UID: "u1", KubeletConfigKey: "kubelet"}
	b := v1alpha1.RevisionSnapshot{Revision: "b", Namespace: "kube-system", Name: "blue-b", UID: "u2", KubeletConfigKey: "kubelet"}
	a2 := a
	a2.UID = "u3"
	for _, tc := range []struct {
		name     string
		old, new any
		want     []string
	}{
		{name: "a pool listed", new: pool(a, b), want: []string{"kube-system/blue-a", "kube-system/blue-b"}},
		{name: "a snapshot recorded", old: pool(a), new: pool(a, b), want: []string{"kube-system/blue-b"}},
		{name: "a snapshot created again", old: pool(a, b), new: pool(a2, b), want: []string{"kube-system/blue-a"}},
		{name: "a record dropped", old: pool(a, b), new: pool(b), want: []string{"kube-system/blue-a"}},
		{name: "nothing recorded changed", old: pool(a), new: pool(a)},
		{name: "a status from before the record", old: pool(), new: pool()},
		{name: "a pool deleted", old: cache.DeletedFinalStateUnknown{Key: "blue", Obj: pool(a)}, want: []string{"kube-system/blue-a"}},
	} {
		var got []string
		r := New(Config{Log: zap.NewNop(), OnChange: func(key string) { got = append(got, key) }})
		r.changed(tc.old, tc.new)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: changed %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRecorded: a pool's record from the cache, nil for a pool that is not there or records nothing.
func TestRecorded(t *testing.T) {
	r := New(Config{Log: zap.NewNop()})
	a := v1alpha1.RevisionSnapshot{Revision: "a", Namespace: "kube-system", Name: "blue-a", UID: "u1"}
	if err := r.informer.GetStore().Add(pool(a)); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Recorded("blue").Snapshot("a"); !ok || got != a {
		t.Errorf("Recorded(blue) a = %+v %v, want %+v", got, ok, a)
	}
	if got := r.Recorded("green"); got != nil {
		t.Errorf("Recorded(green) = %+v, want nil", got)
	}
}
