// SPDX-License-Identifier: Apache-2.0

package records

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/api/generated/clientset/fake"
	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/poll"
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
	rec, exists := r.Recorded("blue")
	if got, ok := rec.Snapshot("a"); !exists || !ok || got != a {
		t.Errorf("Recorded(blue) a = %+v %v %v, want %+v", got, ok, exists, a)
	}
	if got, exists := r.Recorded("green"); got != nil || exists {
		t.Errorf("Recorded(green) = %+v %v, want nil, not there", got, exists)
	}
	green := pool()
	green.Name = "green"
	if err := r.informer.GetStore().Add(green); err != nil {
		t.Fatal(err)
	}
	if got, exists := r.Recorded("green"); got != nil || !exists {
		t.Errorf("Recorded(green) from before the record = %+v %v, want nil, there", got, exists)
	}
}

// TestSynced: the records answer for every pool once the pools are listed, or at once when their API is
// not installed or not readable: no record would ever come. An apiserver that fails otherwise is waited
// for.
func TestSynced(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{name: "no pool API", err: apierrors.NewNotFound(v1alpha1.Resource(v1alpha1.PoolResource), ""), want: true},
		{name: "forbidden", err: apierrors.NewForbidden(v1alpha1.Resource(v1alpha1.PoolResource), "", errors.New("rbac")), want: true},
		{name: "apiserver unavailable", err: apierrors.NewServiceUnavailable("down"), want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The pools answer every List with tc.err, counted.
			var lists atomic.Int32
			p := fake.NewSimpleClientset()
			p.PrependReactor("list", v1alpha1.PoolResource, func(k8stesting.Action) (bool, runtime.Object, error) {
				lists.Add(1)
				return true, nil, tc.err
			})
			r := New(Config{Log: zap.NewNop(), Pools: p, PollInterval: time.Hour})
			if r.Synced() {
				t.Fatal("synced before listing anything")
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			// Run looks once, then waits PollInterval (an hour): what it concluded from that one answer holds.
			poll.Until(t, fmt.Sprintf("pools listed, Synced %v", tc.want), func() bool { return lists.Load() > 0 && r.Synced() == tc.want })
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

// TestRunKeepsOnlyTheRecords: Run lists the pools through the clientset; the cache answers Recorded and
// keeps nothing of a pool but its record.
func TestRunKeepsOnlyTheRecords(t *testing.T) {
	a := v1alpha1.RevisionSnapshot{Revision: "a", Namespace: "kube-system", Name: "blue-a", UID: "u1"}
	p := pool(a)
	p.Status.CurrentRevision = "a"
	var changed atomic.Int32
	r := New(Config{Log: zap.NewNop(), Pools: fake.NewSimpleClientset(p), OnChange: func(string) { changed.Add(1) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), r.Synced) {
		t.Fatal("records never synced")
	}
	rec, exists := r.Recorded("blue")
	if got, ok := rec.Snapshot("a"); !exists || !ok || got != a {
		t.Errorf("Recorded(blue) a = %+v %v %v, want %+v", got, ok, exists, a)
	}
	if n := changed.Load(); n != 1 {
		t.Errorf("OnChange called %d times, want once (blue-a listed)", n)
	}
	obj, _, _ := r.informer.GetStore().GetByKey("blue")
	if cached := obj.(*v1alpha1.KubeletConfigPool); cached.Status.CurrentRevision != "" {
		t.Errorf("cached pool keeps status.currentRevision %q, want only the record", cached.Status.CurrentRevision)
	}
}

// TestPreviews: a pool's preview stands from its request until its completion or the pool's deletion;
// OnPreview is called when it comes, changes (revision, request time, selector, snapshot record) or goes,
// and only then; the standing previews are listed by pool name.
func TestPreviews(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	a := v1alpha1.RevisionSnapshot{Revision: "a", Namespace: "kube-system", Name: "blue-a", UID: "u1", KubeletConfigKey: "kubelet"}
	previewing := func(name, rev string, at metav1.Time, done *metav1.Time, sel map[string]string, items ...v1alpha1.RevisionSnapshot) *v1alpha1.KubeletConfigPool {
		p := pool(items...)
		p.Name = name
		p.Spec.NodeSelector = metav1.LabelSelector{MatchLabels: sel}
		p.Status.Preview = &v1alpha1.PreviewStatus{Revision: rev, RequestTime: at, CompletionTime: done}
		return p
	}
	workers := map[string]string{"role": "worker"}
	type step struct {
		old, new any
		told     bool     // OnPreview called
		standing []string // pool/revision of the standing previews after it
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "requested, then completed", steps: []step{
			{new: previewing("blue", "a", t0, nil, workers, a), told: true, standing: []string{"blue/a"}},
			{old: previewing("blue", "a", t0, nil, workers, a), new: previewing("blue", "a", t0, &t1, workers, a), told: true},
		}},
		{name: "unchanged status write", steps: []step{
			{new: previewing("blue", "a", t0, nil, workers, a), told: true, standing: []string{"blue/a"}},
			{old: previewing("blue", "a", t0, nil, workers, a), new: previewing("blue", "a", t0, nil, workers, a), standing: []string{"blue/a"}},
		}},
		{name: "requested again", steps: []step{
			{new: previewing("blue", "a", t0, nil, workers, a), told: true, standing: []string{"blue/a"}},
			{new: previewing("blue", "a", t1, nil, workers, a), told: true, standing: []string{"blue/a"}},
		}},
		{name: "selector changed", steps: []step{
			{new: previewing("blue", "a", t0, nil, workers, a), told: true, standing: []string{"blue/a"}},
			{new: previewing("blue", "a", t0, nil, map[string]string{"role": "db"}, a), told: true, standing: []string{"blue/a"}},
		}},
		{name: "snapshot recorded after the request", steps: []step{
			{new: previewing("blue", "a", t0, nil, workers), told: true, standing: []string{"blue/a"}},
			{new: previewing("blue", "a", t0, nil, workers, a), told: true, standing: []string{"blue/a"}},
		}},
		{name: "completed before seen", steps: []step{{new: previewing("blue", "a", t0, &t1, workers, a)}}},
		{name: "two pools, then one deleted", steps: []step{
			{new: previewing("green", "g", t0, nil, workers), told: true, standing: []string{"green/g"}},
			{new: previewing("blue", "a", t0, nil, workers, a), told: true, standing: []string{"blue/a", "green/g"}},
			{old: cache.DeletedFinalStateUnknown{Key: "green", Obj: previewing("green", "g", t0, nil, workers)}, told: true,
				standing: []string{"blue/a"}},
		}},
	} {
		told := 0
		r := New(Config{Log: zap.NewNop(), OnPreview: func(string) { told++ }})
		for i, s := range tc.steps {
			told = 0
			r.changed(s.old, s.new)
			var got []string
			for _, p := range r.Previews() {
				got = append(got, p.Pool+"/"+p.Revision)
			}
			if (told > 0) != s.told || !slices.Equal(got, s.standing) {
				t.Errorf("%s, step %d: told %d times, standing %v; want told %v, standing %v", tc.name, i, told, got, s.told, s.standing)
			}
		}
	}
	// What a node is matched and served by.
	r := New(Config{Log: zap.NewNop()})
	r.changed(nil, previewing("blue", "a", t0, nil, workers, a))
	p := r.Previews()[0]
	if !p.Recorded || p.Snapshot != a || !p.RequestTime.Equal(t0.Time) ||
		!p.Selector.Matches(labels.Set{"role": "worker"}) || p.Selector.Matches(labels.Set{"role": "db"}) {
		t.Errorf("preview %+v, want a's record, requested %v, selecting role=worker", p, t0)
	}
}

// TestTransformKeepsPreview: the informer's transform keeps what previews are made of.
func TestTransformKeepsPreview(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	p := pool()
	p.Spec.NodeSelector = metav1.LabelSelector{MatchLabels: map[string]string{"role": "worker"}}
	p.Spec.ConfigMap.Name = "dropped"
	p.Status.Preview = &v1alpha1.PreviewStatus{Revision: "a", RequestTime: t0}
	got, err := transform(p)
	if err != nil {
		t.Fatal(err)
	}
	kept := got.(*v1alpha1.KubeletConfigPool)
	if kept.Spec.NodeSelector.MatchLabels["role"] != "worker" || kept.Status.Preview == nil ||
		kept.Status.Preview.Revision != "a" || kept.Spec.ConfigMap.Name != "" {
		t.Errorf("transformed pool %+v: want its selector and preview kept, the rest dropped", kept)
	}
}
