// SPDX-License-Identifier: Apache-2.0

// Package configmaps watches exactly the ConfigMaps that Nodes reference. Each referenced ConfigMap gets an
// informer filtered to its name (the list/watch the original kubelet ran, but once per ConfigMap instead of
// once per node), started when the first Node references it and stopped when the last one lets go. A cluster
// with 10,000 unrelated ConfigMaps costs nothing; 2,000 nodes sharing one ConfigMap cost one watch.
//
// Watches are bounded when distinct configs are many (every node on a ConfigMap of its own, the worst case):
// past NamespaceThreshold referenced ConfigMaps in one namespace, one informer on the whole namespace replaces
// theirs, so a namespace never costs the apiserver more than NamespaceThreshold watches. The price is caching
// every ConfigMap of that namespace; it is kept until no Node references a ConfigMap there, so a count
// hovering at the threshold does not switch back and forth.
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// Key names a ConfigMap as "namespace/name".
func Key(namespace, name string) string { return namespace + "/" + name }

// Tracker runs the per-ConfigMap informers. Create it with New; it does nothing until Run.
type Tracker struct {
	client     kubernetes.Interface
	namespaces resolve.Namespaces
	log        *zap.Logger
	onChange   func(key string)

	// threshold is the number of referenced ConfigMaps in one namespace past which it is watched whole.
	threshold int

	mu        sync.Mutex
	ctx       context.Context // set by Run; informers started before Run wait for it
	byNode    map[string]string
	refs      map[string]map[string]struct{}
	informers map[string]*tracked // per ConfigMap, by key
	// wholeNamespaces holds the namespace-wide informers, by namespace; perNamespace counts referenced keys.
	wholeNamespaces map[string]*tracked
	perNamespace    map[string]int
}

// NamespaceThreshold is how many referenced ConfigMaps of one namespace get an informer each; one more, and
// the namespace gets one informer for all. A node's informer costs the apiserver a watch and its memory
// (the benchmark's worst case measures ~35 KB per watch); 100 keeps a cluster of hash-suffixed, shared
// configs on per-ConfigMap watches and bounds a cluster of per-node configs.
const NamespaceThreshold = 100

type tracked struct {
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	// synced is set once the informer has listed (namespace-wide informers: then the per-ConfigMap
	// informers of its namespace are stopped).
	synced bool
}

// Config of a Tracker.
type Config struct {
	// Log is where the tracker says which ConfigMaps and namespaces it starts and stops watching; nil:
	// nowhere.
	Log *zap.Logger
	// Client lists and watches the ConfigMaps. Required.
	Client kubernetes.Interface
	// Namespaces are where ConfigMaps are read (--config-namespaces). The tracker never lists or watches
	// outside them: the controller refuses such sources first, and Track ignores them as a second line (a
	// cluster-wide list would be Forbidden anyway).
	Namespaces resolve.Namespaces
	// OnChange is called with a ConfigMap's key whenever it is added, changes (a new ResourceVersion), is
	// deleted, or its informer finishes its first list — the moment "not found" becomes trustworthy.
	// Required.
	OnChange func(key string)
}

// New returns a Tracker.
func New(cfg Config) *Tracker {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Tracker{
		client: cfg.Client, namespaces: cfg.Namespaces, log: cfg.Log, onChange: cfg.OnChange, threshold: NamespaceThreshold,
		byNode: map[string]string{}, refs: map[string]map[string]struct{}{}, informers: map[string]*tracked{},
		wholeNamespaces: map[string]*tracked{}, perNamespace: map[string]int{},
	}
}

// Run lets informers run until ctx ends, then stops them all.
func (t *Tracker) Run(ctx context.Context) error {
	t.mu.Lock()
	t.ctx = ctx
	for key, tr := range t.informers {
		t.startLocked(key, tr)
	}
	for ns, tr := range t.wholeNamespaces {
		t.startNamespaceLocked(ns, tr)
	}
	t.mu.Unlock()
	<-ctx.Done()
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, tr := range t.informers {
		tr.cancel()
		delete(t.informers, key)
	}
	for ns, tr := range t.wholeNamespaces {
		tr.cancel()
		delete(t.wholeNamespaces, ns)
	}
	return nil
}

// Track records that node references the ConfigMap key ("" for none), starting and stopping informers.
// A key outside the tracker's namespaces (or not namespace/name) counts as none: it is never watched.
func (t *Tracker) Track(node, key string) {
	if ns, name, ok := strings.Cut(key, "/"); key != "" && (!ok || name == "" || !t.namespaces.Allows(ns)) {
		t.log.Error("refused to watch configmap outside --config-namespaces", zap.String("node", node),
			zap.String("configmap", key), zap.Stringer("configNamespaces", t.namespaces))
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
			t.stopLocked(old)
			ns := namespaceOf(old)
			if t.perNamespace[ns]--; t.perNamespace[ns] == 0 {
				delete(t.perNamespace, ns)
				if tr, ok := t.wholeNamespaces[ns]; ok {
					if tr.cancel != nil {
						tr.cancel()
					}
					delete(t.wholeNamespaces, ns)
					t.log.Info("stopped watching namespace's configmaps", zap.String("namespace", ns))
				}
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
		ns := namespaceOf(key)
		t.perNamespace[ns]++
		if whole, ok := t.wholeNamespaces[ns]; ok {
			// Already in the namespace's cache once it has listed; until then its sync reports every key.
			if whole.synced {
				go t.onChange(key)
			}
		} else if t.perNamespace[ns] > t.threshold {
			whole := t.newNamespaceInformer(ns)
			t.wholeNamespaces[ns] = whole
			t.log.Info("watching the whole namespace's configmaps: too many referenced for one watch each",
				zap.String("namespace", ns), zap.Int("referenced", t.perNamespace[ns]), zap.Int("threshold", t.threshold))
			if t.ctx != nil {
				t.startNamespaceLocked(ns, whole)
			}
		} else if _, ok := t.informers[key]; !ok {
			tr := t.newInformer(key)
			t.informers[key] = tr
			if t.ctx != nil {
				t.startLocked(key, tr)
			}
		}
	}
	t.refs[key][node] = struct{}{}
}

// stopLocked stops key's own informer, if it has one.
func (t *Tracker) stopLocked(key string) {
	tr, ok := t.informers[key]
	if !ok {
		return
	}
	if tr.cancel != nil { // nil: never started (Run has not begun)
		tr.cancel()
	}
	delete(t.informers, key)
	t.log.Info("stopped watching configmap", zap.String("configmap", key))
}

func namespaceOf(key string) string {
	ns, _, _ := strings.Cut(key, "/")
	return ns
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

// Watched is the number of watches the tracker holds: one per ConfigMap watched alone, one per namespace
// watched whole.
func (t *Tracker) Watched() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.informers) + len(t.wholeNamespaces)
}

// Get returns the ConfigMap from its informer's cache (nil if it does not exist) and whether that answer
// is trustworthy yet (the informer has synced). The object is shared: never modify it.
func (t *Tracker) Get(key string) (*corev1.ConfigMap, bool, error) {
	t.mu.Lock()
	tr, ok := t.informers[key]
	if whole, wok := t.wholeNamespaces[namespaceOf(key)]; wok && (whole.synced || !ok) {
		tr, ok = whole, true
	}
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
	lw := cache.NewListWatchFromClient(t.client.CoreV1().RESTClient(), "configmaps", ns,
		fields.OneTermEqualSelector("metadata.name", name))
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

// newNamespaceInformer watches every ConfigMap of ns, and reports changes of the referenced ones.
func (t *Tracker) newNamespaceInformer(ns string) *tracked {
	cms := t.client.CoreV1().ConfigMaps(ns)
	// As client-go's generated informers do since WatchListClient is on by default (1.35): a client that
	// cannot stream the initial list through a watch (the fake clientset) says so, and is listed instead.
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object,
			error) {
			return cms.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface,
			error) {
			return cms.Watch(ctx, o)
		},
	}, t.client)
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	// Only what a Node references is read; the rest of the namespace is cached without its managed fields.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			cm.ManagedFields = nil
		}
		return obj, nil
	})
	notify := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		t.mu.Lock()
		_, referenced := t.refs[key]
		t.mu.Unlock()
		if referenced {
			t.onChange(key)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify,
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.ConfigMap)
			n, ok2 := newObj.(*corev1.ConfigMap)
			if !ok1 || !ok2 || o.ResourceVersion != n.ResourceVersion {
				notify(newObj)
			}
		},
		DeleteFunc: notify,
	})
	return &tracked{informer: inf}
}

// startNamespaceLocked runs ns's informer; once it has listed, it answers for every key of ns and the
// per-ConfigMap informers there are stopped.
func (t *Tracker) startNamespaceLocked(ns string, tr *tracked) {
	ctx, cancel := context.WithCancel(t.ctx)
	tr.cancel = cancel
	go tr.informer.RunWithContext(ctx)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), tr.informer.HasSynced) {
			return
		}
		t.mu.Lock()
		if t.wholeNamespaces[ns] != tr {
			t.mu.Unlock()
			return
		}
		tr.synced = true
		var keys []string
		for key := range t.refs {
			if namespaceOf(key) == ns {
				keys = append(keys, key)
				t.stopLocked(key)
			}
		}
		t.mu.Unlock()
		for _, key := range keys {
			t.onChange(key)
		}
	}()
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
