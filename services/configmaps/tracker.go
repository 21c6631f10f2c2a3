// Package configmaps watches exactly the ConfigMaps that Nodes reference. Each referenced ConfigMap gets an
// informer filtered to its name (the list/watch the original kubelet ran, but once per ConfigMap instead of
// once per node), started when the first Node references it and stopped when the last one lets go. A cluster
// with 10,000 unrelated ConfigMaps costs nothing; 2,000 nodes sharing one ConfigMap cost one watch.
//
// Every list and watch is namespaced, and only in the namespaces dkc-server reads configs from
// (--config-namespaces), which is all its RBAC grants (namespaced Roles, no ClusterRole on ConfigMaps).
package configmaps

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/services/resolve"
)

// Key names a ConfigMap as "namespace/name".
func Key(namespace, name string) string { return namespace + "/" + name }

// Tracker runs the per-ConfigMap informers. Create it with New; it does nothing until Run.
type Tracker struct {
	client     kubernetes.Interface
	namespaces resolve.Namespaces
	log        *zap.Logger
	onChange   func(key string)

	mu        sync.Mutex
	ctx       context.Context // set by Run; informers started before Run wait for it
	byNode    map[string]string
	refs      map[string]map[string]struct{}
	informers map[string]*tracked
}

type tracked struct {
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
}

// New returns a Tracker. onChange is called with a ConfigMap's key whenever it is added, changes
// (a new ResourceVersion), is deleted, or its informer finishes its first list — the moment "not found"
// becomes trustworthy. The tracker never lists or watches outside namespaces: the controller refuses such
// sources first, and Track ignores them as a second line (a cluster-wide list would be Forbidden anyway).
func New(client kubernetes.Interface, namespaces resolve.Namespaces, log *zap.Logger, onChange func(key string)) *Tracker {
	return &Tracker{
		client: client, namespaces: namespaces, log: log, onChange: onChange,
		byNode: map[string]string{}, refs: map[string]map[string]struct{}{}, informers: map[string]*tracked{},
	}
}

// Run lets informers run until ctx ends, then stops them all.
func (t *Tracker) Run(ctx context.Context) error {
	t.mu.Lock()
	t.ctx = ctx
	for key, tr := range t.informers {
		t.startLocked(key, tr)
	}
	t.mu.Unlock()
	<-ctx.Done()
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, tr := range t.informers {
		tr.cancel()
		delete(t.informers, key)
	}
	return nil
}

// Track records that node references the ConfigMap key ("" for none), starting and stopping informers.
// A key outside the tracker's namespaces (or not namespace/name) counts as none: it is never watched.
func (t *Tracker) Track(node, key string) {
	if ns, name, ok := strings.Cut(key, "/"); key != "" && (!ok || name == "" || !t.namespaces.Allows(ns)) {
		t.log.Error("refused to watch configmap outside --config-namespaces", zap.String("node", node), zap.String("configmap", key),
			zap.Stringer("configNamespaces", t.namespaces))
		key = ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.byNode[node]
	if old == key {
		return
	}
	if old != "" {
		delete(t.refs[old], node)
		if len(t.refs[old]) == 0 {
			delete(t.refs, old)
			if tr, ok := t.informers[old]; ok {
				if tr.cancel != nil { // nil: never started (Run has not begun)
					tr.cancel()
				}
				delete(t.informers, old)
				t.log.Info("stopped watching configmap", zap.String("configmap", old))
			}
		}
	}
	if key == "" {
		delete(t.byNode, node)
		return
	}
	t.byNode[node] = key
	if t.refs[key] == nil {
		t.refs[key] = map[string]struct{}{}
	}
	t.refs[key][node] = struct{}{}
	if _, ok := t.informers[key]; !ok {
		tr := t.newInformer(key)
		t.informers[key] = tr
		if t.ctx != nil {
			t.startLocked(key, tr)
		}
	}
}

// Nodes returns the nodes that reference key.
func (t *Tracker) Nodes(key string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	nodes := make([]string, 0, len(t.refs[key]))
	for n := range t.refs[key] {
		nodes = append(nodes, n)
	}
	return nodes
}

// Watched is the number of ConfigMaps being watched.
func (t *Tracker) Watched() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.informers)
}

// Get returns the ConfigMap from its informer's cache (nil if it does not exist) and whether that answer
// is trustworthy yet (the informer has synced). The object is shared: never modify it.
func (t *Tracker) Get(key string) (*corev1.ConfigMap, bool, error) {
	t.mu.Lock()
	tr, ok := t.informers[key]
	t.mu.Unlock()
	if !ok || !tr.informer.HasSynced() {
		return nil, false, nil
	}
	obj, exists, err := tr.informer.GetStore().GetByKey(key)
	if err != nil || !exists {
		return nil, true, err
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return nil, true, fmt.Errorf("configmap informer for %s holds a %T", key, obj)
	}
	return cm, true, nil
}

func (t *Tracker) newInformer(key string) *tracked {
	ns, name, _ := strings.Cut(key, "/")
	lw := cache.NewListWatchFromClient(t.client.CoreV1().RESTClient(), "configmaps", ns, fields.OneTermEqualSelector("metadata.name", name))
	// No periodic resync: every change arrives as a watch event, and a resync would only re-deliver
	// identical objects that change nothing.
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	notify := func() { t.onChange(key) }
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { notify() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.ConfigMap)
			n, ok2 := newObj.(*corev1.ConfigMap)
			if !ok1 || !ok2 || o.ResourceVersion != n.ResourceVersion {
				notify()
			}
		},
		DeleteFunc: func(any) { notify() }, // tombstones included: only the key matters
	})
	return &tracked{informer: inf}
}

func (t *Tracker) startLocked(key string, tr *tracked) {
	ctx, cancel := context.WithCancel(t.ctx)
	tr.cancel = cancel
	t.log.Info("watching configmap", zap.String("configmap", key))
	go tr.informer.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), tr.informer.HasSynced) {
			t.onChange(key)
		}
	}()
}
