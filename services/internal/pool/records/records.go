// SPDX-License-Identifier: Apache-2.0

// Package records keeps, on every dkc-server replica, what each KubeletConfigPool's status records of the
// revision snapshots its controller created (status.revisionSnapshots): the service serves a pool's
// snapshot only with the UID recorded there (docs/security.md, "Revision snapshots"). The pool controller
// runs on the leader only; every replica serves nodes, so each watches the pools itself.
package records

import (
	"context"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// PollInterval is how often Run looks for the KubeletConfigPool API while it is not installed;
	// default 30s.
	PollInterval time.Duration
}

// Records is the pools' snapshot records, from a KubeletConfigPool informer.
type Records struct {
	cfg      Config
	informer cache.SharedIndexInformer
	absent   atomic.Bool // the KubeletConfigPool API was not found, or not readable, at the last look
}

// New builds Records; they are empty until Run has listed the pools.
func New(cfg Config) *Records {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 30 * time.Second
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func(string) {}
	}
	r := &Records{cfg: cfg}
	// An informer of its own rather than a factory's: its transform is its own (the pool controller's
	// informer keeps whole pools), and it starts only once the API is served (Run).
	r.informer = poolinformers.NewKubeletConfigPoolInformer(cfg.Pools, 0, cache.Indexers{})
	// Only the record is read: the rest of a pool (its conditions, failed nodes) is not kept.
	_ = r.informer.SetTransform(func(obj any) (any, error) {
		p, ok := obj.(*v1alpha1.KubeletConfigPool)
		if !ok {
			return obj, nil
		}
		return &v1alpha1.KubeletConfigPool{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
			Status:     v1alpha1.KubeletConfigPoolStatus{RevisionSnapshots: p.Status.RevisionSnapshots},
		}, nil
	})
	_, _ = r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.changed(nil, obj) },
		UpdateFunc: r.changed,
		DeleteFunc: func(obj any) { r.changed(obj, nil) },
	})
	return r
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
// (either may be nil or a tombstone).
func (r *Records) changed(oldObj, newObj any) {
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
