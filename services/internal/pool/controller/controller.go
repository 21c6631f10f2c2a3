// SPDX-License-Identifier: Apache-2.0

// Package controller is the KubeletConfigPool controller (docs/design.md, "KubeletConfigPool"): for each
// pool it checks the pool's ConfigMap, freezes it into a revision (package revision), judges the selected
// Nodes and picks the next ones (package plan), assigns them through the same dkc.dev/config-source the
// sidecars follow, writes the pool's status and prunes old revisions. It runs in dkc-server on the leader
// only (leader election is the server's); the shape is sample-controller's: informers feed a rate-limited
// workqueue keyed by pool name, workers never modify cached objects.
//
// It watches KubeletConfigPools (its own informer, from the generated client of api/generated), the
// snapshots (one informer per --config-namespaces namespace, filtered to the dkc.dev/pool label), the pools'
// ConfigMaps (a configmaps.Tracker of its own: one watch per ConfigMap) and Nodes through dkc-server's one
// shared Node informer (an event handler added while it leads, removed after).
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	policyinformers "k8s.io/client-go/informers/policy/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/dkc-dev/dkc/api/generated/clientset"
	poolinformers "github.com/dkc-dev/dkc/api/generated/informers/api/v1alpha1"
	poollisters "github.com/dkc-dev/dkc/api/generated/listers/api/v1alpha1"
	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodedrain"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// FieldManager names the controller's writes (Node assignments, pool status, snapshots).
const FieldManager = "dkc-pool-controller"

// Event reasons on a pool.
const (
	EventAssigned      = "Assigned"
	EventNodeFailed    = "NodeFailed"
	EventHalted        = "Halted"
	EventConfigInvalid = "ConfigInvalid"
)

// indexPool indexes snapshots by their dkc.dev/pool label.
const indexPool = "pool"

// ConfigMaps is what the controller needs of a ConfigMap tracker (configmaps.Tracker): here the tracked
// parties are pools, not nodes.
type ConfigMaps interface {
	Track(pool, key string)
	Get(key string) (*corev1.ConfigMap, bool, error)
	Nodes(key string) []string
	Run(ctx context.Context) error
}

// Config of a Controller.
type Config struct {
	Log    *zap.Logger
	Client kubernetes.Interface
	// Pools is the dkc.dev clientset; it must speak JSON (CRDs speak no protobuf).
	Pools clientset.Interface
	// Nodes is dkc-server's shared Node informer; the controller adds a handler, never a second watch.
	Nodes coreinformers.NodeInformer
	// Namespaces are --config-namespaces: a pool's ConfigMap must be in one, and snapshots are watched there.
	Namespaces resolve.Namespaces
	Recorder   record.EventRecorder
	// Metrics, if not nil, receives the pools' counts and halts.
	Metrics *Metrics
	Workers int
	// Clock defaults to the real one.
	Clock clock.Clock
	// ConfigMaps, if not nil, builds the tracker of the pools' ConfigMaps (tests); default configmaps.New.
	ConfigMaps func(onChange func(key string)) ConfigMaps
	// QueueMetrics, if not nil, receives the pool queue's metrics (queue name "pools").
	QueueMetrics workqueue.MetricsProvider
	// CRDPollInterval is how often Run looks for the KubeletConfigPool API while it is not installed;
	// default 30s.
	CRDPollInterval time.Duration
	// Kubelets, if not nil, checks each new revision with the kubelet's own code, for every kubelet minor
	// among the pool's nodes, before any node is assigned it (kubeletChecks).
	Kubelets KubeletChecker
	// Previews: each new revision is previewed on the selected nodes by their sidecars before any node is
	// assigned it (preview.go), as the pool's spec.disruption.previewTimeout says. Off, no pool waits for
	// answers (tests of everything else).
	Previews bool
}

// Controller rolls KubeletConfigPools out. Build one with New for each term as leader: Run ends with its
// context, and its queue with it.
type Controller struct {
	cfg       Config
	log       *zap.Logger
	clock     clock.Clock
	queue     workqueue.TypedRateLimitingInterface[string]
	pools     cache.SharedIndexInformer
	poolList  poollisters.KubeletConfigPoolLister
	snapshots map[string]cache.SharedIndexInformer // by namespace
	nodes     corelisters.NodeLister
	cms       ConfigMaps
	exp       *expectations
	repairs   repairsAsked
	// assignedAt is when the controller last assigned nodes of each pool, until the stored status shows
	// it: a status write that failed after the assignments (a Conflict) must not lose the time, which
	// starts pauseBetweenBatches' batch.
	mu         sync.Mutex
	assignedAt map[string]metav1.Time
	// deleted are the snapshots ("namespace/name") this controller deleted this term: a pool re-created
	// under its name may need one again while the snapshot cache still shows it, and ensureSnapshot must
	// not take that for the snapshot existing.
	deleted map[string]bool
	// created are the snapshots ("namespace/name") this controller created this term and did not store in
	// their pool's record yet, with their UIDs: a record write that failed must not make it refuse its own.
	created map[string]types.UID
	// kubelets checks configs with the kubelet's code (nil: not checked here).
	kubelets *kubeletChecks
	// termStart is when this term's workers started (set before they do, read-only after): no node's
	// nodeTimeout counts time before it, when no leader watched.
	termStart time.Time
	// runCtx is Run's context (set before the workers start): drains end with the term.
	runCtx context.Context
	// drains are the node drains of pools that may drain (drain.go).
	drains *drains
	// gated are the nodes through the workload gate this term (pods.go).
	gated *podsGated
	// computed keeps each pool's per-node values between syncs (pernode.go).
	computed *computedValues
	// capacity are the pools' last CapacityRefused verdicts (nodeChecks), guarded by mu.
	capacity map[string]capacityVerdict
	// pdbs are the cluster's PodDisruptionBudgets, which batches keep (budgets.go).
	pdbs    cache.SharedIndexInformer
	pdbList policylisters.PodDisruptionBudgetLister
	// budgetMu serialises the pools' decisions and assignments (decideAndAssign).
	budgetMu sync.Mutex
}

// New builds a controller; it does nothing until Run.
func New(cfg Config) *Controller {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	if cfg.CRDPollInterval <= 0 {
		cfg.CRDPollInterval = 30 * time.Second
	}
	if cfg.Recorder == nil {
		cfg.Recorder = &record.FakeRecorder{}
	}
	c := &Controller{
		cfg: cfg, log: cfg.Log, clock: cfg.Clock, nodes: cfg.Nodes.Lister(), exp: newExpectations(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pools", MetricsProvider: cfg.QueueMetrics}),
		snapshots: map[string]cache.SharedIndexInformer{}, assignedAt: map[string]metav1.Time{},
		deleted: map[string]bool{}, created: map[string]types.UID{}, capacity: map[string]capacityVerdict{},
		kubelets: newKubeletChecks(cfg.Kubelets, cfg.Log, cfg.Clock), drains: newDrains(), gated: newPodsGated(),
		computed: newComputedValues(),
		runCtx:   context.Background(),
	}
	// An informer of its own rather than a factory's: it lives for one term, and dkc-server's other pool
	// informer (package records) keeps only what it reads of each pool.
	c.pools = poolinformers.NewKubeletConfigPoolInformer(cfg.Pools, 0, cache.Indexers{})
	c.poolList = poollisters.NewKubeletConfigPoolLister(c.pools.GetIndexer())
	// No handler: a pool held back by a budget polls (plan), as the budget moves with pods it cannot see.
	c.pdbs = policyinformers.NewPodDisruptionBudgetInformer(cfg.Client, metav1.NamespaceAll, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	c.pdbList = policylisters.NewPodDisruptionBudgetLister(c.pdbs.GetIndexer())
	// Run waits for this informer like the others: an install whose ClusterRole predates it (a new image,
	// the old RBAC) would wait silently, every pool stopped. Say so, naming the fix.
	_ = c.pdbs.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			c.log.Error("cannot list PodDisruptionBudgets: no pool rolls out until dkc-server's ClusterRole "+
				"grants list and watch on poddisruptionbudgets (deploy/base/server-rbac.yaml)", zap.Error(err))
			return
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	_, _ = c.pools.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, n any) { c.enqueue(n) },
		DeleteFunc: c.enqueue,
	})
	for _, ns := range cfg.Namespaces.List() {
		byPool := func(obj any) ([]string, error) {
			if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Labels[v1alpha1.LabelPool] != "" {
				return []string{cm.Labels[v1alpha1.LabelPool]}, nil
			}
			return nil, nil
		}
		inf := coreinformers.NewFilteredConfigMapInformer(cfg.Client, ns, 0, cache.Indexers{indexPool: byPool},
			func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelPool })
		onSnapshot := func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Labels[v1alpha1.LabelPool] != "" {
				c.queue.Add(cm.Labels[v1alpha1.LabelPool])
			}
		}
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: onSnapshot, UpdateFunc: func(_, n any) { onSnapshot(n) }, DeleteFunc: onSnapshot,
		})
		c.snapshots[ns] = inf
	}
	onChange := func(key string) {
		for _, p := range c.cms.Nodes(key) {
			c.queue.Add(p)
		}
	}
	if cfg.ConfigMaps != nil {
		c.cms = cfg.ConfigMaps(onChange)
	} else {
		c.cms = configmaps.New(configmaps.Config{Log: cfg.Log.Named("configmaps"), Client: cfg.Client,
			Namespaces: cfg.Namespaces, OnChange: onChange})
	}
	return c
}

func (c *Controller) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// Run waits for the KubeletConfigPool API (logging once while it is not installed), starts the
// informers, waits for their caches, then runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if !c.waitForAPI(ctx) {
		return nil
	}
	// Deferred in this order, they run in reverse: the queue shuts down (workers return), everything
	// started here is told to stop, then waited for, and last the gauges are cleared — after the
	// workers, or a sync in flight would set them again on a replica that no longer leads.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer c.cfg.Metrics.reset()
	defer wg.Wait()
	defer cancel()
	defer c.queue.ShutDown()
	run := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	run(func() { c.pools.RunWithContext(ctx) })
	run(func() { c.pdbs.RunWithContext(ctx) })
	synced := []cache.InformerSynced{c.pools.HasSynced, c.pdbs.HasSynced, c.cfg.Nodes.Informer().HasSynced}
	for _, inf := range c.snapshots {
		run(func() { inf.RunWithContext(ctx) })
		synced = append(synced, inf.HasSynced)
	}
	run(func() { _ = c.cms.Run(ctx) })
	reg, err := c.cfg.Nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { c.enqueueForNode(obj) },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || nodeChanged(on, nn) {
				c.enqueueForNode(o)
				c.enqueueForNode(n)
			}
		},
		DeleteFunc: func(obj any) { c.enqueueForNode(obj) },
	})
	if err != nil {
		return fmt.Errorf("watch nodes for pools: %w", err)
	}
	defer func() { _ = c.cfg.Nodes.Informer().RemoveEventHandler(reg) }()
	synced = append(synced, reg.HasSynced)
	if !cache.WaitForNamedCacheSync("kubeletconfigpools", ctx.Done(), synced...) {
		return nil
	}
	c.runCtx = ctx
	defer c.drains.stopAll() // before wg.Wait: a drain in flight ends with the term
	c.startTerm()
	c.log.Info("rolling out kubeletconfigpools", zap.Int("workers", c.cfg.Workers), zap.Time("termStart", c.termStart))
	for range c.cfg.Workers {
		run(func() { wait.UntilWithContext(ctx, c.worker, time.Second) })
	}
	run(func() { wait.UntilWithContext(ctx, c.sweep, sweepInterval) })
	<-ctx.Done()
	return nil
}

// startTerm records when this term's work starts: the caches are synced and no worker runs yet.
func (c *Controller) startTerm() { c.termStart = c.clock.Now() }

// waitForAPI returns once the apiserver serves KubeletConfigPools, false if ctx ends first. A cluster
// without the CRD (deploy/crds not applied, the benchmark's) gets one log line, not one per poll.
func (c *Controller) waitForAPI(ctx context.Context) bool {
	logged := false
	for {
		_, err := c.cfg.Pools.DkcV1alpha1().KubeletConfigPools().List(ctx, metav1.ListOptions{Limit: 1})
		switch {
		case err == nil:
			if logged {
				c.log.Info("kubeletconfigpool API installed")
			}
			return true
		case ctx.Err() != nil:
			return false
		case !logged:
			if apierrors.IsNotFound(err) {
				c.log.Info("kubeletconfigpool API not installed (apply deploy/crds); pools are rolled out once it is",
					zap.Duration("pollInterval", c.cfg.CRDPollInterval))
			} else {
				c.log.Warn("cannot list kubeletconfigpools; retrying quietly", zap.Error(err),
					zap.Duration("pollInterval", c.cfg.CRDPollInterval))
			}
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(c.cfg.CRDPollInterval):
		}
	}
}

// nodeChanged says whether a Node update can change what a pool sees of it: heartbeats cannot.
func nodeChanged(o, n *corev1.Node) bool {
	for _, a := range []string{nodeconfig.SourceAnnotation, nodeconfig.StatusAnnotation, v1alpha1.AnnotationAssignment,
		nodedrain.CordonedAnnotation, nodeconfig.DrainedAnnotation, nodeconfig.DriftRepairAnnotation} {
		if o.Annotations[a] != n.Annotations[a] {
			return true
		}
	}
	return o.UID != n.UID || ready(o) != ready(n) || !labels.Equals(o.Labels, n.Labels) ||
		previewOf(o) != previewOf(n) || driftOf(o) != driftOf(n) ||
		o.Spec.Unschedulable != n.Spec.Unschedulable ||
		!apiequality.Semantic.DeepEqual(o.Spec.ConfigSource, n.Spec.ConfigSource) || perNodeInputChanged(o, n)
}

// perNodeInputChanged says whether what per-node values (spec.perNode) read of a Node changed, other than
// its labels: its annotations, provider ID, taints, capacity, allocatable or kubelet. None changes with a
// heartbeat.
func perNodeInputChanged(o, n *corev1.Node) bool {
	return !maps.Equal(o.Annotations, n.Annotations) || o.Spec.ProviderID != n.Spec.ProviderID ||
		!apiequality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
		!apiequality.Semantic.DeepEqual(o.Status.Capacity, n.Status.Capacity) ||
		!apiequality.Semantic.DeepEqual(o.Status.Allocatable, n.Status.Allocatable) ||
		!apiequality.Semantic.DeepEqual(o.Status.NodeInfo, n.Status.NodeInfo)
}

// enqueueForNode queues the pools whose selector picks the node, and the pool that last assigned it.
func (c *Controller) enqueueForNode(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	if a, ok := assignmentOf(n); ok {
		c.queue.Add(a.Pool)
	}
	set := labels.Set(n.Labels)
	for _, s := range c.selectors() {
		if s.sel.Matches(set) {
			c.queue.Add(s.pool)
		}
	}
}

// selectors are every pool's parsed nodeSelector (a pool being deleted still selects: its nodes stay
// held by an overlapping pool until it is gone). A selector that does not parse selects nothing.
func (c *Controller) selectors() []selector {
	var out []selector
	pools, _ := c.poolList.List(labels.Everything()) // a cache's List never fails
	for _, p := range pools {
		if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.NodeSelector); err == nil {
			out = append(out, selector{pool: p.Name, sel: sel})
		}
	}
	return out
}

func (c *Controller) worker(ctx context.Context) {
	for {
		name, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		requeue, err := c.sync(ctx, name)
		switch {
		case err != nil:
			if apierrors.IsConflict(err) {
				c.log.Debug("pool or node changed meanwhile; syncing again", zap.String("pool", name), zap.Error(err))
			} else {
				c.log.Error("sync kubeletconfigpool", zap.String("pool", name), zap.Error(err))
			}
			c.queue.AddRateLimited(name)
		default:
			c.queue.Forget(name)
			if requeue > 0 {
				c.queue.AddAfter(name, requeue)
			}
		}
		c.queue.Done(name)
	}
}

// sync brings one pool a step on; it returns when to look again though nothing changes. A pool that is
// gone is forgotten and its snapshots collected; one being deleted is left alone; a live one rolls out.
func (c *Controller) sync(ctx context.Context, name string) (time.Duration, error) {
	pool, err := c.poolList.Get(name) // shared with the cache: never modified
	switch {
	case apierrors.IsNotFound(err):
		c.forget(name)
		c.releaseGone(ctx, name)
		return c.collect(ctx, name)
	case err != nil:
		return 0, err
	case pool.DeletionTimestamp != nil:
		// Someone else's finalizer holds it: it assigns nothing more; its snapshots go once it is gone.
		c.cms.Track(name, "")
		return 0, nil
	}
	return c.rollout(ctx, pool)
}

// forget drops what the controller keeps of a pool that is gone: its last assignment time, its
// ConfigMap's watch and its gauges.
func (c *Controller) forget(name string) {
	c.mu.Lock()
	delete(c.assignedAt, name)
	c.mu.Unlock()
	c.computed.forget(name)
	c.cms.Track(name, "")
	c.cfg.Metrics.forget(name)
	c.gated.forget(name)
	c.mu.Lock()
	delete(c.capacity, name)
	c.mu.Unlock()
}

// rollout is sync for a live pool, one step after the other: its config read and its nodes selected,
// the config frozen into the target revision, the plan decided, the plan's nodes assigned, the status
// written, old revisions pruned. A step that fails ends the sync, and the queue retries it whole: every
// step is idempotent, and the plan is made again from what the caches show then.
func (c *Controller) rollout(ctx context.Context, pool *v1alpha1.KubeletConfigPool) (time.Duration, error) {
	now := c.clock.Now().Truncate(time.Second) // what the annotation's and the status's times keep
	cm, synced, err := c.configMap(pool)
	if err != nil {
		return 0, err
	}
	if !synced {
		return 0, nil // the tracker calls back once its informer has listed
	}
	all, selected, selectorErr, err := c.selectNodes(pool)
	if err != nil {
		return 0, err
	}
	pool, target, invalid, preview, err := c.freeze(ctx, pool, cm, selected, now)
	if err != nil {
		return 0, err
	}
	if selectorErr != nil {
		invalid = &plan.Invalid{Reason: v1alpha1.ReasonValidationFailed, Message: "spec.nodeSelector: " + selectorErr.Error()}
	}
	p, byName, err := c.decideAndAssign(ctx, pool, target, invalid, preview, selected, now)
	if err != nil {
		return 0, err
	}
	// In use: what the nodes are to run, and what the pool just assigned that no cached Node shows yet.
	inUse := target.Revisions()
	for _, r := range c.exp.revisions(pool.Name, now) {
		inUse[r] = true
	}
	p.Status.RevisionSnapshots = c.keptSnapshots(pool.Status.RevisionSnapshots, p.Status, inUse)
	if err := c.writeStatus(ctx, pool, p.Status); err != nil {
		return 0, err
	}
	c.drainNodes(ctx, pool, target, p.Nodes, byName, all)
	if target.Revision != "" {
		if err := c.prune(ctx, pool, p.Status, inUse, all); err != nil {
			return 0, err
		}
	}
	after := p.RequeueAfter
	if invalid != nil && invalid.Reason == v1alpha1.ReasonCapacityRefused && (after == 0 || after > capacityRecheck) {
		// The pods that do not fit may go (a drain, a scale-down) without any event the pool watches.
		after = capacityRecheck
	}
	return c.requeueAfter(pool.Name, after), nil
}

// configMap is the pool's ConfigMap, which the tracker watches for the pool from now on: nil when there
// is none, or when --config-namespaces leaves its namespace out (checkConfig says why). synced is false
// until the tracker's informer has listed.
func (c *Controller) configMap(pool *v1alpha1.KubeletConfigPool) (cm *corev1.ConfigMap, synced bool, err error) {
	ref := pool.Spec.ConfigMap
	if !c.cfg.Namespaces.Allows(ref.Namespace) {
		c.cms.Track(pool.Name, "")
		return nil, true, nil
	}
	key := configmaps.Key(ref.Namespace, ref.Name)
	c.cms.Track(pool.Name, key)
	cm, synced, err = c.cms.Get(key)
	if err != nil {
		return nil, false, fmt.Errorf("read configmap %s: %w", key, err)
	}
	return cm, synced, nil
}

// selectNodes lists every Node (prune must know what all of them use) and those the pool's nodeSelector
// picks. A selector that does not parse (selectorErr) selects nothing, and makes the config invalid.
func (c *Controller) selectNodes(pool *v1alpha1.KubeletConfigPool) (
	all, selected []*corev1.Node, selectorErr, err error) {
	mine, err := metav1.LabelSelectorAsSelector(&pool.Spec.NodeSelector)
	if err != nil {
		selectorErr, mine = err, labels.Nothing()
	}
	all, err = c.nodes.List(labels.Everything())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range all {
		if mine.Matches(labels.Set(n.Labels)) {
			selected = append(selected, n)
		}
	}
	return all, selected, selectorErr, nil
}

// freeze checks the pool's config and freezes it into a revision, its snapshot created if need be: the
// target to roll out, or why the config is invalid — and then the target is the last valid revision, if
// any, which the nodes are still judged against. The pool it returns is the one to go on with:
// ensureSnapshot may have written the pool's record of its snapshots. A new revision is previewed on the
// nodes (preview.go) once its snapshot exists: while the preview waits, the target is the last revision.
func (c *Controller) freeze(ctx context.Context, pool *v1alpha1.KubeletConfigPool, cm *corev1.ConfigMap,
	selected []*corev1.Node, now time.Time) (*v1alpha1.KubeletConfigPool, plan.Target, *plan.Invalid, *plan.Preview,
	error) {
	ref := pool.Spec.ConfigMap
	invalid := checkConfig(ref, c.cfg.Namespaces, cm)
	var target plan.Target
	var preview *plan.Preview
	if invalid == nil {
		var err error
		rev, snap := revision.Snapshot(pool, cm)
		if rev != pool.Status.CurrentRevision && c.cfg.Kubelets != nil {
			// With per-node values the pool's revision is checked as it is too (nodeTargets checks each
			// node's own), and nodeChecks is left to each node's sidecar, which predicts on its own config.
			// The kubelet's own check, for the minors of the nodes it would reach, before the revision exists.
			content := []byte(cm.Data[ref.KubeletConfigKey])
			if invalid, err = c.kubelets.check(ctx, ref, rev, content, kubeletMinors(selected)); err != nil {
				return nil, plan.Target{}, nil, nil, err
			}
			// And what it would do on the nodes that run one of the pool's revisions: to the state their
			// kubelets checkpointed (a pool that may drain drains the nodes whose sidecars say so instead,
			// drain.go), and to the pods running there.
			if invalid == nil && pool.Spec.PerNode == nil {
				if invalid, err = c.nodeChecks(ctx, pool, rev, content, selected); err != nil {
					return nil, plan.Target{}, nil, nil, err
				}
			}
		}
		if invalid == nil {
			if pool, invalid, err = c.ensureSnapshot(ctx, pool, ref.KubeletConfigKey, rev, snap); err != nil {
				return nil, plan.Target{}, nil, nil, err
			}
		}
		perNode := pool.Spec.PerNode != nil
		var nodes map[string]plan.NodeTarget
		if invalid == nil && perNode {
			if pool, nodes, invalid, err = c.nodeTargets(ctx, pool, rev, cm.Data, selected, now); err != nil {
				return nil, plan.Target{}, nil, nil, err
			}
		}
		// A pool with per-node values is not previewed: each node's sidecar makes the same predictions on
		// its own config before its restart, and refuses what it must (a failure in the pool's budget).
		if invalid == nil && rev != pool.Status.CurrentRevision && c.cfg.Previews && !perNode &&
			pool.Spec.PreviewTimeoutOrDefault() > 0 {
			o := c.preview(pool, rev, selected, c.selectors(), now)
			preview, invalid = o.preview, o.invalid
		}
		if invalid == nil && (preview == nil || !preview.Waiting) {
			target = plan.Target{Revision: rev, Source: revision.Source(pool, rev), PerNode: perNode, Nodes: nodes}
		}
		if !perNode {
			c.computed.forget(pool.Name)
		}
	}
	if preview == nil && c.cfg.Previews {
		why := "the config went back to revision " + pool.Status.CurrentRevision
		switch {
		case invalid != nil:
			why = "the config was refused (" + invalid.Reason + ")"
		case pool.Spec.PerNode != nil:
			why = "the pool computes values per node (spec.perNode), which are not previewed"
		case pool.Spec.PreviewTimeoutOrDefault() == 0:
			why = "spec.disruption.previewTimeout became 0s"
		}
		preview = c.abandonedPreview(pool, why)
	}
	if cur := pool.Status.CurrentRevision; target.Revision == "" && cur != "" {
		// Nodes are judged against the last valid revision meanwhile (while the new one is invalid, or
		// previewed).
		target = plan.Target{Revision: cur, Source: revision.Source(pool, cur)}
		if pool.Spec.PerNode != nil {
			target.PerNode, target.Nodes = true, assignedTargets(pool, cur, selected)
		}
	}
	return pool, target, invalid, preview, nil
}

// decide plans the pool's next step on the selected nodes as the controller sees them: with the
// assignments it made that its cache does not show yet (expectations), and the pods of the nodes in the
// workload gate (pods.go). byName are the selected nodes.
func (c *Controller) decide(ctx context.Context, pool *v1alpha1.KubeletConfigPool, target plan.Target,
	invalid *plan.Invalid, preview *plan.Preview, selected []*corev1.Node, now time.Time) (plan.Plan,
	map[string]*corev1.Node, error) {
	others := c.selectors()
	byName := map[string]*corev1.Node{}
	looked := map[string]bool{} // the nodes whose pods were judged
	reads := c.newPodReads(ctx)
	var views []plan.Node
	for _, n := range selected {
		byName[n.Name] = n
		nt := target.For(n.Name)
		v := c.exp.apply(pool, n, view(n, pool, nt, others, c.cfg.Namespaces), nt, now)
		v.Repair = c.repairs.of(n.Name, v.Status, v.Repair, now)
		v.Draining, v.DrainFailed = c.drains.of(pool.Name, nt.Revision, n.Name)
		if c.gatesPods(pool, nt, v, now) {
			pods, err := reads.of(n.Name)
			if err != nil {
				return plan.Plan{}, nil, err
			}
			mem := c.gated.saw(pool.Name, n.Name, nt.Revision, pods, v.AssignedAt)
			v.Pods, looked[n.Name] = fared(pods, v.AssignedAt, mem), true
		}
		views = append(views, v)
	}
	in := plan.Input{Pool: c.withAssignmentTime(pool), Target: target, Invalid: invalid, Preview: preview, Nodes: views,
		Now: now, TermStart: c.termStart}
	budgets, err := c.budgets(ctx, byName, reads)
	if err != nil {
		return plan.Plan{}, nil, fmt.Errorf("list poddisruptionbudgets: %w", err)
	}
	if budgets != nil {
		in.Budgets = budgets
	}
	p := plan.Decide(in)
	c.gated.prune(pool.Name, byName)
	if budgets != nil && budgets.err != nil {
		return plan.Plan{}, nil, budgets.err
	}
	if pool.Spec.PodReadinessTimeoutOrDefault() > 0 {
		// The gate's "before": which pods are not Ready as the nodes are assigned (podsGated).
		for _, node := range p.Assign {
			pods, err := reads.of(node)
			if err != nil {
				return plan.Plan{}, nil, err
			}
			c.gated.assigning(pool.Name, node, target.For(node).Revision, pods)
		}
	}
	for _, v := range p.Nodes {
		if v.State == plan.Updated && looked[v.Name] {
			c.gated.pass(pool.Name, v.Name, target.For(v.Name).Revision)
		}
	}
	return p, byName, nil
}

// decideAndAssign decides the pool's step and assigns its nodes, one pool at a time: with
// PodDisruptionBudgets, two workers deciding at once would each spend a budget's room before the other's
// assignment shows (the expectations assignBatch records are what the next decision sees).
func (c *Controller) decideAndAssign(ctx context.Context, pool *v1alpha1.KubeletConfigPool, target plan.Target,
	invalid *plan.Invalid, preview *plan.Preview, selected []*corev1.Node, now time.Time) (plan.Plan,
	map[string]*corev1.Node, error) {
	c.budgetMu.Lock()
	defer c.budgetMu.Unlock()
	p, byName, err := c.decide(ctx, pool, target, invalid, preview, selected, now)
	if err != nil {
		return plan.Plan{}, nil, err
	}
	if err := c.assignBatch(ctx, pool, target, p.Assign, byName, now); err != nil {
		return plan.Plan{}, nil, err
	}
	if err := c.askRepairs(ctx, pool, target, p.Repair, byName, now); err != nil {
		return plan.Plan{}, nil, err
	}
	if err := c.withdrawRepairs(ctx, pool, p.Withdraw, byName); err != nil {
		return plan.Plan{}, nil, err
	}
	return p, byName, nil
}

// assignBatch assigns the nodes the target, each expected before it is patched, and records one Event
// for those it assigned, even when a patch fails. The assignment time is recorded with the first of them,
// so that a batch cut short by a failed patch still starts pauseBetweenBatches' clock.
func (c *Controller) assignBatch(ctx context.Context, pool *v1alpha1.KubeletConfigPool, target plan.Target,
	nodes []string, byName map[string]*corev1.Node, now time.Time) error {
	var assigned []string // the nodes patched so far
	for _, node := range nodes {
		nt := target.For(node)
		a := v1alpha1.Assignment{Pool: pool.Name, Revision: nt.Revision, Namespace: nt.Source.Namespace,
			KubeletConfigKey: nt.Source.KubeletConfigKey, Time: metav1.Time{Time: now}}
		c.exp.expect(pool.Name, node, a, now)
		if err := c.assign(ctx, byName[node], nt.Source, a); err != nil {
			c.exp.drop(pool.Name, node)
			c.assignedEvent(pool, target, assigned)
			return err
		}
		if len(assigned) == 0 {
			c.mu.Lock()
			c.assignedAt[pool.Name] = metav1.Time{Time: now}
			c.mu.Unlock()
		}
		if was := c.replaced(byName[node], pool); was != "" {
			// The operator learns what was overwritten, to put it back elsewhere if it mattered.
			c.log.Info("assigned node, replacing a source the pool had not assigned", zap.String("pool", pool.Name),
				zap.String("node", node), zap.String("revision", nt.Revision), zap.String("replaced", was))
			node += " (replacing " + was + ")"
		} else {
			c.log.Info("assigned node", zap.String("pool", pool.Name), zap.String("node", node),
				zap.String("revision", nt.Revision))
		}
		if nt.Revision != target.Revision {
			node += " (its own revision " + nt.Revision + ")"
		}
		assigned = append(assigned, node)
	}
	c.assignedEvent(pool, target, assigned)
	return nil
}

// writeStatus publishes the pool's new status: to the gauges, and to the apiserver when it differs from
// the stored one, and then records the Events of what it newly shows.
func (c *Controller) writeStatus(ctx context.Context, pool *v1alpha1.KubeletConfigPool,
	st v1alpha1.KubeletConfigPoolStatus) error {
	c.cfg.Metrics.observe(pool.Name, st)
	if apiequality.Semantic.DeepEqual(pool.Status, st) {
		return nil
	}
	up := pool.DeepCopy()
	up.Status = st
	if _, err := c.updateStatus(ctx, up); err != nil {
		return fmt.Errorf("update status of kubeletconfigpool %s: %w", pool.Name, err)
	}
	// Only now: a transition is one once stored. A Conflict, or a sync on a cache that does not show
	// the write yet (whose own write then conflicts), must not repeat the Events or count a halt twice.
	c.events(pool, st)
	return nil
}

// requeueAfter is when to sync the pool again though nothing changes: when the plan says, or sooner
// when an assignment the cache has not confirmed yet would expire before.
func (c *Controller) requeueAfter(pool string, planned time.Duration) time.Duration {
	if c.exp.pending(pool) > 0 && (planned == 0 || planned > expectationTTL) {
		// An expectation the cache never confirms expires; look again then.
		return expectationTTL + time.Second
	}
	return planned
}

// updateStatus writes the pool's status (PUT .../kubeletconfigpools/NAME/status): a Conflict when the
// pool changed since it was read.
func (c *Controller) updateStatus(ctx context.Context,
	pool *v1alpha1.KubeletConfigPool) (*v1alpha1.KubeletConfigPool, error) {
	return c.cfg.Pools.DkcV1alpha1().KubeletConfigPools().UpdateStatus(ctx, pool,
		metav1.UpdateOptions{FieldManager: FieldManager})
}

// withAssignmentTime is the pool as the planner must see it: with the time of the controller's last
// assignment even when the status write that recorded it failed. The cached pool is never modified.
func (c *Controller) withAssignmentTime(pool *v1alpha1.KubeletConfigPool) *v1alpha1.KubeletConfigPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.assignedAt[pool.Name]
	if !ok {
		return pool
	}
	if stored := pool.Status.LastAssignmentTime; stored != nil && !stored.Before(&t) {
		delete(c.assignedAt, pool.Name)
		return pool
	}
	pool = pool.DeepCopy()
	pool.Status.LastAssignmentTime = &t
	return pool
}

// maxFailedEvents bounds the NodeFailed Events of one sync: past it, one Event sums the failures up (a
// config every node refuses fails them all at once; failedNodes lists each).
const maxFailedEvents = 3

// events records on the pool what its stored status newly shows, for an operator: the pool halted, nodes
// failed, the config became invalid — Halted first, as it is what to act on.
func (c *Controller) events(pool *v1alpha1.KubeletConfigPool, st v1alpha1.KubeletConfigPoolStatus) {
	became := func(typ string) *metav1.Condition {
		n := meta.FindStatusCondition(st.Conditions, typ)
		if n == nil || n.Status != metav1.ConditionTrue || meta.IsStatusConditionTrue(pool.Status.Conditions, typ) {
			return nil
		}
		return n
	}
	if cond := became(v1alpha1.ConditionHalted); cond != nil {
		c.cfg.Metrics.countHalt(pool.Name)
		c.log.Warn("pool halted", zap.String("pool", pool.Name), zap.String("message", cond.Message))
		c.cfg.Recorder.Event(pool, corev1.EventTypeWarning, EventHalted, cond.Message)
	}
	old := map[string]bool{}
	for _, f := range pool.Status.FailedNodes {
		old[f.Name+"/"+f.Revision] = true
	}
	var failed []v1alpha1.FailedNode
	for _, f := range st.FailedNodes {
		if !old[f.Name+"/"+f.Revision] {
			failed = append(failed, f)
		}
	}
	if len(failed) <= maxFailedEvents {
		for _, f := range failed {
			c.cfg.Recorder.Eventf(pool, corev1.EventTypeWarning, EventNodeFailed, "node %s failed revision %s: %s: %s",
				f.Name, f.Revision, f.Reason, f.Error)
		}
	} else {
		items := make([]string, 0, len(failed))
		for _, f := range failed {
			items = append(items, f.Name+" ("+f.Reason+")")
		}
		c.cfg.Recorder.Eventf(pool, corev1.EventTypeWarning, EventNodeFailed,
			"%d nodes failed revision %s: %s; status.failedNodes has their errors",
			len(failed), failed[0].Revision, capped(items))
	}
	if cond := became(v1alpha1.ConditionConfigInvalid); cond != nil {
		c.cfg.Recorder.Eventf(pool, corev1.EventTypeWarning, EventConfigInvalid, "%s: %s; no node is touched",
			cond.Reason, cond.Message)
	}
}

// assignedEvent records one Event for the nodes a sync assigned (a batch), not one per node.
func (c *Controller) assignedEvent(pool *v1alpha1.KubeletConfigPool, target plan.Target, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	c.cfg.Recorder.Eventf(pool, corev1.EventTypeNormal, EventAssigned, "assigned revision %s (%s/%s) to %d node(s): %s",
		target.Revision, target.Source.Namespace, target.Source.Name, len(nodes), capped(nodes))
}

// replaced names the source an assignment overwrites when the pool did not set it (by hand, another
// tool, another pool): "" for the local config or the pool's own earlier assignment. A node the pool
// assigned and someone changed since is held, never overwritten; one it never assigned is the pool's to
// assign, as selecting it is the operator's word (docs/design.md §11).
func (c *Controller) replaced(n *corev1.Node, pool *v1alpha1.KubeletConfigPool) string {
	src, _, err := resolve.NodeSource(n, c.cfg.Namespaces)
	if err != nil {
		return "an unusable source"
	}
	if src == nil || src.ConfigMap == nil {
		return ""
	}
	if a, ok := assignmentOf(n); ok && a.Pool == pool.Name && names(src, revision.AssignedSource(pool, a)) {
		return ""
	}
	return src.ConfigMap.Namespace + "/" + src.ConfigMap.Name
}

// maxListed bounds the names an Event lists.
const maxListed = 10

func capped(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxListed)
}

// assign points the node at the snapshot: the dkc.dev/config-source annotation (and spec.configSource
// where the apiserver keeps it and the node has one, as resolve reads it first), with the assignment
// record beside it. The patch carries the cached resourceVersion: a node changed since the plan was made
// (assigned by hand meanwhile) is a Conflict, and the pool plans again.
func (c *Controller) assign(ctx context.Context, n *corev1.Node, src corev1.ConfigMapNodeConfigSource,
	a v1alpha1.Assignment) error {
	if n == nil {
		return errors.New("assign: node not in the cache")
	}
	source, err := json.Marshal(corev1.NodeConfigSource{ConfigMap: &src})
	if err != nil {
		return err
	}
	record, err := json.Marshal(a)
	if err != nil {
		return err
	}
	patch := map[string]any{"metadata": map[string]any{
		"resourceVersion": n.ResourceVersion,
		"annotations": map[string]string{
			nodeconfig.SourceAnnotation: string(source), v1alpha1.AnnotationAssignment: string(record),
		},
	}}
	if n.Spec.ConfigSource != nil {
		patch["spec"] = map[string]any{"configSource": corev1.NodeConfigSource{ConfigMap: &src}}
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: FieldManager}
	if _, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, data, opts); err != nil {
		return fmt.Errorf("assign node %s revision %s of pool %s: %w", n.Name, a.Revision, a.Pool, err)
	}
	return nil
}
