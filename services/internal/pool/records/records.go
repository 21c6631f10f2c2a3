// SPDX-License-Identifier: Apache-2.0

// Package records keeps, on every dkc-server replica, what each KubeletConfigPool's status records of the
// revision snapshots its controller created (status.revisionSnapshots): the service serves a pool's
// snapshot only with the UID recorded there (docs/security.md, "Revision snapshots"). It also keeps each
// pool's standing preview request (status.preview) with the pool's node selector: every replica sends it
// to the selected nodes it serves. The pool controller runs on the leader only; every replica serves
// nodes, so each watches the pools itself.
package records

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/api/generated/clientset"
	poolinformers "github.com/dkc-dev/dkc/api/generated/informers/api/v1alpha1"
	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// Config of Records.
type Config struct {
	Log *zap.Logger
	// Pools is the dkc.dev clientset; it must speak JSON (CRDs speak no protobuf).
	Pools clientset.Interface
	// OnChange is called with the key ("namespace/name") of each snapshot whose record a pool adds,
	// changes or drops: the nodes whose source names it are resolved again.
	OnChange func(key string)
	// OnPreview is called with a pool's name when its standing preview (Previews) comes, goes, or changes:
	// its revision, request time, node selector, or the record of the revision's snapshot.
	OnPreview func(pool string)
	// PollInterval is how often Run looks for the KubeletConfigPool API while it is not installed;
	// default 30s.
	PollInterval time.Duration
}

// Records is the pools' snapshot records, from a KubeletConfigPool informer.
type Records struct {
	cfg      Config
	informer cache.SharedIndexInformer
	absent   atomic.Bool // the KubeletConfigPool API was not found, or not readable, at the last look

	mu       sync.Mutex
	standing map[string]Preview        // by pool; written by the informer's handler only
	previews atomic.Pointer[[]Preview] // standing's values by pool name, replaced (never changed) on a change
}

// Preview is a pool's standing request to preview a revision: its status.preview without completionTime.
// Shared by every caller: never modify it.
type Preview struct {
	Pool        string
	Revision    string
	RequestTime time.Time
	// Selector is the pool's spec.nodeSelector: the nodes asked. One that does not parse selects nothing.
	Selector labels.Selector
	// Snapshot is the pool's record of the revision's snapshot; Recorded is false when there is none.
	Snapshot v1alpha1.RevisionSnapshot
	Recorded bool
}

// same says whether two previews ask the same nodes the same thing.
func (p Preview) same(o Preview) bool {
	return p.Pool == o.Pool && p.Revision == o.Revision && p.RequestTime.Equal(o.RequestTime) &&
		p.Selector.String() == o.Selector.String() && p.Snapshot == o.Snapshot && p.Recorded == o.Recorded
}

// New builds Records; they are empty until Run has listed the pools.
func New(cfg Config) *Records {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 30 * time.Second
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func(string) {}
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.OnPreview == nil {
		cfg.OnPreview = func(string) {}
	}
	r := &Records{cfg: cfg, standing: map[string]Preview{}}
	// An informer of its own rather than a factory's: its transform is its own (the pool controller's
	// informer keeps whole pools), and it starts only once the API is served (Run).
	r.informer = poolinformers.NewKubeletConfigPoolInformer(cfg.Pools, 0, cache.Indexers{})
	// Only the record, the preview and the selector it asks are read: the rest of a pool (its conditions,
	// failed nodes) is not kept.
	_ = r.informer.SetTransform(transform)
	_, _ = r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.changed(nil, obj) },
		UpdateFunc: r.changed,
		DeleteFunc: func(obj any) { r.changed(obj, nil) },
	})
	return r
}

// transform keeps of a pool what Records reads.
func transform(obj any) (any, error) {
	p, ok := obj.(*v1alpha1.KubeletConfigPool)
	if !ok {
		return obj, nil
	}
	return &v1alpha1.KubeletConfigPool{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec:       v1alpha1.KubeletConfigPoolSpec{NodeSelector: p.Spec.NodeSelector},
		Status: v1alpha1.KubeletConfigPoolStatus{RevisionSnapshots: p.Status.RevisionSnapshots,
			Preview: p.Status.Preview},
	}, nil
}

// Recorded returns the snapshots pool records, and whether the pool exists (is listed). rec is nil when
// the pool does not exist, or its status predates the record.
func (r *Records) Recorded(pool string) (rec *v1alpha1.RevisionSnapshots, exists bool) {
	obj, exists, err := r.informer.GetStore().GetByKey(pool)
	if err != nil || !exists {
		return nil, false
	}
	p, ok := obj.(*v1alpha1.KubeletConfigPool)
	if !ok {
		return nil, false
	}
	return p.Status.RevisionSnapshots, true
}

// Previews are the pools' standing previews, by pool name; nil when none stands. The slice is shared:
// never modify it.
func (r *Records) Previews() []Preview {
	if p := r.previews.Load(); p != nil {
		return *p
	}
	return nil
}

// Run waits for the KubeletConfigPool API (quietly: a cluster without the CRD has no pool snapshots to
// check), then keeps the records until ctx ends.
func (r *Records) Run(ctx context.Context) error {
	logged := false
	for {
		_, err := r.cfg.Pools.DkcV1alpha1().KubeletConfigPools().List(ctx, metav1.ListOptions{Limit: 1})
		// Not installed, or not this replica's to read (RBAC): no record will come, so none is waited for.
		r.absent.Store(apierrors.IsNotFound(err) || apierrors.IsForbidden(err))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !logged && !apierrors.IsNotFound(err) {
			r.cfg.Log.Warn("cannot list kubeletconfigpools: nodes whose source is a pool's snapshot they "+
				"do not run yet wait until it can",
				zap.Error(err), zap.Duration("pollInterval", r.cfg.PollInterval))
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.PollInterval):
		}
	}
	r.informer.RunWithContext(ctx)
	return nil
}

// Synced reports whether Recorded answers for every pool: the pools have been listed, or their API is not
// installed or not readable by dkc-server (then no pool's record can be known: Recorded finds none).
func (r *Records) Synced() bool { return r.absent.Load() || r.informer.HasSynced() }

// changed calls OnChange for every snapshot whose record differs between the two versions of a pool
// (either may be nil or a tombstone), and OnPreview when its standing preview does.
func (r *Records) changed(oldObj, newObj any) {
	r.previewChanged(oldObj, newObj)
	before, after := items(oldObj), items(newObj)
	for key, uid := range before {
		if after[key] != uid {
			r.cfg.OnChange(key)
		}
	}
	for key := range after {
		if _, ok := before[key]; !ok {
			r.cfg.OnChange(key)
		}
	}
}

// items are a pool's recorded snapshots: "namespace/name" → UID and key.
func items(obj any) map[string]string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*v1alpha1.KubeletConfigPool)
	if !ok || p.Status.RevisionSnapshots == nil {
		return nil
	}
	out := map[string]string{}
	for _, s := range p.Status.RevisionSnapshots.Items {
		out[s.Namespace+"/"+s.Name] = string(s.UID) + "/" + s.KubeletConfigKey
	}
	return out
}

// previewChanged updates the standing previews from a pool's new version (nil: deleted), and calls
// OnPreview if the pool's changed. It compares with what it last recorded, not with oldObj (used only for
// a deleted pool's name): that is what the callers were told.
func (r *Records) previewChanged(oldObj, newObj any) {
	p := poolOf(newObj)
	deleted := p == nil
	if deleted {
		p = poolOf(oldObj)
	}
	if p == nil {
		return
	}
	next, stands := standing(p)
	stands = stands && !deleted
	r.mu.Lock()
	prev, stood := r.standing[p.Name]
	if stood == stands && (!stands || prev.same(next)) {
		r.mu.Unlock()
		return
	}
	if stands {
		r.standing[p.Name] = next
	} else {
		delete(r.standing, p.Name)
	}
	list := make([]Preview, 0, len(r.standing))
	for _, v := range r.standing {
		list = append(list, v)
	}
	slices.SortFunc(list, func(a, b Preview) int { return strings.Compare(a.Pool, b.Pool) })
	if len(list) == 0 {
		list = nil
	}
	r.previews.Store(&list)
	r.mu.Unlock()
	if stands {
		r.cfg.Log.Info("pool preview stands", zap.String("pool", p.Name), zap.String("revision", next.Revision),
			zap.Time("requestTime", next.RequestTime), zap.Stringer("nodeSelector", next.Selector),
			zap.Bool("snapshotRecorded", next.Recorded))
	} else {
		r.cfg.Log.Info("pool preview no longer stands", zap.String("pool", p.Name))
	}
	r.cfg.OnPreview(p.Name)
}

// standing is pool p's preview, if one stands: requested and not completed.
func standing(p *v1alpha1.KubeletConfigPool) (Preview, bool) {
	pv := p.Status.Preview
	if pv == nil || pv.CompletionTime != nil {
		return Preview{}, false
	}
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.NodeSelector)
	if err != nil {
		sel = labels.Nothing() // the CRD's validation should have refused it; asking nobody is safe
	}
	out := Preview{Pool: p.Name, Revision: pv.Revision, RequestTime: pv.RequestTime.Time, Selector: sel}
	out.Snapshot, out.Recorded = p.Status.RevisionSnapshots.Snapshot(pv.Revision)
	return out, true
}

// poolOf is obj's pool, through a tombstone; nil if it holds none.
func poolOf(obj any) *v1alpha1.KubeletConfigPool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, _ := obj.(*v1alpha1.KubeletConfigPool)
	return p
}
