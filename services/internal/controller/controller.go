// SPDX-License-Identifier: Apache-2.0

// Package controller keeps every Node's desired state current: it watches Nodes and the ConfigMaps they
// reference, and for each node resolves its config source (package resolve) into the assignment table that
// WatchConfig streams read. The shape is sample-controller's: informers feed a rate-limited workqueue keyed
// by node name; workers never modify cached objects.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
	"github.com/dkc-dev/dkc/services/internal/configmaps"
	poolrecords "github.com/dkc-dev/dkc/services/internal/pool/records"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// ConfigMaps is what the controller needs of the ConfigMap tracker (configmaps.Tracker).
type ConfigMaps interface {
	Track(node, key string)
	Get(key string) (*corev1.ConfigMap, bool, error)
	Nodes(key string) []string
	// Run watches the tracked ConfigMaps until ctx ends; Watched is how many watches it holds.
	Run(ctx context.Context) error
	Watched() int
}

// Snapshots is what the controller needs of the pools' records of their revision snapshots
// (records.Records).
type Snapshots interface {
	// Recorded returns the snapshots pool records, and whether the pool exists; rec is nil when it does
	// not, or its status predates the record.
	Recorded(pool string) (rec *v1alpha1.RevisionSnapshots, exists bool)
	// Synced reports whether Recorded answers for every pool: the pools are listed, or their API is not
	// installed.
	Synced() bool
	// Run keeps the records until ctx ends.
	Run(ctx context.Context) error
	// Previews are the pools' standing previews by pool name (shared: never modify).
	Previews() []poolrecords.Preview
}

// Controller resolves Nodes into the assignment table.
type Controller struct {
	log         *zap.Logger
	nodes       corelisters.NodeLister
	nodesSynced cache.InformerSynced
	cms         ConfigMaps
	table       *assignment.Table
	namespaces  resolve.Namespaces // where sources may point (--config-namespaces)
	queue       workqueue.TypedRateLimitingInterface[string]
	shared      *shared           // the resolved ConfigMap versions nodes are on
	forget      func(node string) // drops what others hold of a deleted Node
	pacer       Pacer             // nil: direct config changes are not paced
	snapshots   Snapshots         // nil: no pool records any snapshot, nor asks for a preview
	previews    *previews         // what is held of the pools' standing previews
	now         func() time.Time
}

// Config of a Controller.
type Config struct {
	Log *zap.Logger
	// Nodes is the Node informer of the service's one informer factory.
	Nodes coreinformers.NodeInformer
	Table *assignment.Table
	// Namespaces are where sources may point (--config-namespaces): sources outside are refused
	// (nodeconfig.NamespaceNotAllowedError) and their ConfigMaps never read.
	Namespaces resolve.Namespaces
	// ConfigMaps builds the ConfigMap tracker, which calls onChange with a ConfigMap's key when it changes.
	ConfigMaps func(onChange func(key string)) ConfigMaps
	// Forget, if not nil, is called with the name of each deleted Node, after the node has left the table:
	// whatever else holds per-node state (the status writer's reports) lets go of it there, so that memory
	// follows the live Nodes.
	Forget func(node string)
	// QueueMetrics, if not nil, receives the node queue's metrics (queue name "nodes").
	QueueMetrics workqueue.MetricsProvider
	// Pacer, if not nil, bounds the nodes changing to a new direct config version at once; it is built
	// with a wake function, which the controller gives through Wake.
	Pacer Pacer
	// Snapshots, if not nil, builds the pools' snapshot records, which call onChange with the key of a
	// snapshot whose record changed, and onPreview with the name of a pool whose standing preview did.
	// Without them no pool records anything: a pool's snapshot is sent only to a node already running it,
	// and no preview is sent.
	Snapshots func(onChange func(key string), onPreview func(pool string)) Snapshots
}

// New wires the controller to its Node informer and builds its ConfigMap tracker.
func New(cfg Config) *Controller {
	c := &Controller{
		log:         cfg.Log,
		now:         time.Now,
		forget:      cfg.Forget,
		namespaces:  cfg.Namespaces,
		nodes:       cfg.Nodes.Lister(),
		nodesSynced: cfg.Nodes.Informer().HasSynced,
		table:       cfg.Table,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodes", MetricsProvider: cfg.QueueMetrics}),
		shared:   newShared(),
		pacer:    cfg.Pacer,
		previews: newPreviews(),
	}
	c.cms = cfg.ConfigMaps(c.onConfigMapChange)
	if cfg.Snapshots != nil {
		c.snapshots = cfg.Snapshots(c.onConfigMapChange, c.onPreviewChange)
	}
	_, _ = cfg.Nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			// Labels matter while a pool's preview stands: they say whether its selector matches.
			if !ok1 || !ok2 || needsSync(o, n) || c.outcomeChanged(o, n) ||
				(c.previewing() && !maps.Equal(o.Labels, n.Labels)) {
				c.enqueue(newObj)
			}
		},
		DeleteFunc: c.enqueue,
	})
	return c
}

// needsSync says whether a Node update can change the node's state. Heartbeats and status writes (our own
// included) do not touch the source: they are skipped. Another UID is another object (deleted and
// registered again, seen as an update across a relist): its node must be told, whatever its source. So is
// another kubelet version (a node upgraded in place): configs are validated with that minor's code. So is
// a cordon or drain mark coming or going: it says whether the node may reset the kubelet's state, and a
// pool's request to repair the node's drift, and while one stands its drift coming or going. So is
// another capacity of CPU, memory or hugepages: the sidecar predicts from it which pods a restart would fail.
func needsSync(o, n *corev1.Node) bool {
	return o.UID != n.UID || o.Status.NodeInfo.KubeletVersion != n.Status.NodeInfo.KubeletVersion ||
		!sameCapacity(o.Status.Capacity, n.Status.Capacity) ||
		sourceChanged(o, n) || o.Spec.Unschedulable != n.Spec.Unschedulable ||
		o.Annotations[nodeconfig.DrainedAnnotation] != n.Annotations[nodeconfig.DrainedAnnotation] ||
		o.Annotations[nodeconfig.DriftRepairAnnotation] != n.Annotations[nodeconfig.DriftRepairAnnotation] ||
		(n.Annotations[nodeconfig.DriftRepairAnnotation] != "" && driftKey(o) != driftKey(n))
}

// driftKey is what of the Node's ConfigDrift condition decides whether a repair request is live.
func driftKey(n *corev1.Node) string {
	cause, since, _ := nodeconfig.DriftOf(n)
	return cause + "@" + since.UTC().Format(time.RFC3339Nano)
}

// sourceChanged says whether an update may change the node's source. It compares exactly (a source without
// subfield is not nil here: it is an error to report), unlike nodeconfig.SameSource, which asks whether two
// sources name the same config.

func sourceChanged(o, n *corev1.Node) bool {
	return o.Annotations[nodeconfig.SourceAnnotation] != n.Annotations[nodeconfig.SourceAnnotation] ||
		!apiequality.Semantic.DeepEqual(o.Spec.ConfigSource, n.Spec.ConfigSource)
}

func (c *Controller) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj) // handles tombstones
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// Wake resolves node again: the pacer calls it when a slot frees for a node waiting for one.
func (c *Controller) Wake(node string) { c.queue.Add(node) }

// onConfigMapChange re-resolves every node that references the ConfigMap key; every node, when it is
// a standing preview's snapshot.
func (c *Controller) onConfigMapChange(key string) {
	all := false
	for _, n := range c.cms.Nodes(key) {
		if _, ok := previewHolderPool(n); ok {
			all = true
			continue
		}
		c.queue.Add(n)
	}
	if all {
		c.enqueueAll()
	}
}

// Run runs the ConfigMap tracker, waits for the Node cache, then runs workers until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer c.queue.ShutDown()
	trackerDone := make(chan error, 1)
	go func() { trackerDone <- c.cms.Run(ctx) }()
	if c.snapshots != nil {
		// Not waited for: only nodes whose source claims to be a pool's snapshot wait for the records
		// (checkSnapshot); every other node is served at once.
		go func() { _ = c.snapshots.Run(ctx) }()
	}
	if !cache.WaitForNamedCacheSync("nodes", ctx.Done(), c.nodesSynced) {
		return errors.Join(ctx.Err(), <-trackerDone)
	}
	c.log.Info("node cache synced", zap.Int("workers", workers))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, c.runWorker, time.Second)
		}()
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return <-trackerDone
}

// WatchedConfigMaps is how many ConfigMap watches the tracker holds.
func (c *Controller) WatchedConfigMaps() int { return c.cms.Watched() }

// Synced reports whether the Node cache has synced (the service serves only then).
func (c *Controller) Synced() bool { return c.nodesSynced() }

func (c *Controller) runWorker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	node, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(node)
	if err := c.sync(ctx, node); err != nil {
		c.log.Warn("sync node failed; retrying", zap.String("node", node), zap.Error(err))
		c.queue.AddRateLimited(node)
		return true
	}
	c.queue.Forget(node)
	return true
}

// sync resolves one node. Errors the node must see (bad source, missing ConfigMap) go into its state and
// are not returned: retrying cannot fix them, and the next Node or ConfigMap event re-resolves the node.
func (c *Controller) sync(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err // shutting down: the node is resolved again wherever the service runs next
	}
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		c.forgetNode(name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("get node %s from cache: %w", name, err)
	}
	src, origin, err := resolve.NodeSource(node, c.namespaces)
	facts := factsOf(node)
	facts.Preview = c.previewFor(node)
	var se *resolve.SourceError
	if errors.As(err, &se) {
		c.refuseSource(node, facts, origin, se)
		return nil
	}
	if err != nil {
		return err
	}
	if src == nil {
		c.assignLocal(node, facts)
		return nil
	}
	return c.syncConfigMap(node, facts, origin, src.ConfigMap)
}

// forgetNode drops everything held for a deleted Node, so that memory follows the live Nodes.
func (c *Controller) forgetNode(name string) {
	c.cms.Track(name, "")
	c.shared.use(name, "")
	c.table.Delete(name)
	c.paceDone(name)
	if c.forget != nil {
		c.forget(name)
	}
	c.log.Info("node deleted; forgot it", zap.String("node", name))
}

// refuseSource records a source the node must be told is invalid. The node keeps the config it runs, so
// nothing it referenced before stays tracked or paced.
func (c *Controller) refuseSource(node *corev1.Node, facts assignment.Facts, origin resolve.Origin,
	se *resolve.SourceError) {
	name := node.Name
	c.cms.Track(name, "")
	c.shared.use(name, "")
	c.paceDone(name)
	if c.setSyncError(name, facts, se.Status) {
		c.log.Info("node config source invalid; node keeps its config", zap.String("node", name),
			zap.String("origin", string(origin)), zap.Stringer("error", se.Status), zap.String("detail", se.Detail))
	}
}

// assignLocal assigns a node without a source its local config.
func (c *Controller) assignLocal(node *corev1.Node, f assignment.Facts) {
	name := node.Name
	c.cms.Track(name, "")
	c.shared.use(name, "")
	c.paceDone(name) // back to the local config: an escape hatch is never held back
	next := assignment.State{Assignment: resolve.Local(), NodeUID: f.NodeUID, KubeletVersion: f.KubeletVersion,
		NodeCapacity: f.NodeCapacity, Drained: nodeconfig.IsDrainedFor(node, "", ""), Preview: f.Preview}
	prev, hadPrev, _ := c.table.Get(name)
	if c.set(name, prev, next) && !c.onlyFactsChanged(name, prev, hadPrev, next) {
		c.log.Info("node assigned local config", zap.String("node", name))
	}
}

// syncConfigMap resolves a node whose source is a ConfigMap: it tracks the ConfigMap, and assigns it only
// once the tracker has it and a revision snapshot it claims to be checks out; until then the node keeps
// what it runs.
func (c *Controller) syncConfigMap(node *corev1.Node, facts assignment.Facts, origin resolve.Origin,
	ref *corev1.ConfigMapNodeConfigSource) error {
	name := node.Name
	key := configmaps.Key(ref.Namespace, ref.Name)
	c.cms.Track(name, key)
	c.shared.use(name, sourceKey(ref))
	cm, synced, err := c.cms.Get(key)
	if err != nil {
		c.setSyncError(name, facts, nodeconfig.SyncInternalError)
		return fmt.Errorf("read configmap %s for node %s: %w", key, name, err)
	}
	if !synced {
		return nil // the tracker calls onConfigMapChange once its first list is done
	}
	if cm == nil {
		c.shared.gone(sourceKey(ref))
		c.paceDone(name)
		if c.setSyncError(name, facts, nodeconfig.DownloadError) {
			c.log.Info("configmap of node not found; node keeps its config", zap.String("node", name),
				zap.String("configmap", key))
		}
		return nil
	}
	if err := c.checkSnapshot(node, ref, cm); err != nil {
		if errors.Is(err, errRecordsPending) {
			// Nothing changes for the node until the records say whether this object is its pool's.
			c.queue.AddAfter(name, recordsPendingRetry)
			return nil
		}
		if c.setSyncError(name, facts, nodeconfig.SnapshotMismatchError) {
			var m *revision.Mismatch
			errors.As(err, &m)
			c.log.Warn("revision snapshot does not match its revision; node keeps its config", zap.String("node", name),
				zap.String("configmap", key), zap.String("uid", string(cm.UID)),
				zap.String("resourceVersion", cm.ResourceVersion), zap.String("kubeletConfigKey", ref.KubeletConfigKey),
				zap.String("detail", m.Detail))
		}
		return nil
	}
	return c.assignConfigMap(node, facts, origin, ref, cm)
}

// assignConfigMap assigns a node the resolved version cm of its source ref, or, where the pacer holds the
// node back, keeps it on what it runs.
func (c *Controller) assignConfigMap(node *corev1.Node, facts assignment.Facts, origin resolve.Origin,
	ref *corev1.ConfigMapNodeConfigSource, cm *corev1.ConfigMap) error {
	name := node.Name
	kubeletVersion := facts.KubeletVersion
	a, err := c.shared.resolve(ref, cm)
	if err != nil {
		c.setSyncError(name, facts, nodeconfig.SyncInternalError)
		return err
	}
	if facts.Preview != nil && assignment.SameAssignment(a, facts.Preview.GetAssignment()) {
		facts.Preview = nil // the node's own source is the previewed snapshot: nothing to preview
	}
	give, held := c.pace(node, cm, a)
	if held {
		c.logHeld(name, a)
	}
	prev, hadPrev, _ := c.table.Get(name)
	// Drained only for the version given: a node held back by the pacer keeps what it runs.
	drained := !held && nodeconfig.IsDrainedFor(node, cm.UID, cm.ResourceVersion)
	next := assignment.State{Assignment: give, NodeUID: facts.NodeUID, KubeletVersion: kubeletVersion,
		NodeCapacity: facts.NodeCapacity, Drained: drained, Preview: facts.Preview}
	if !held {
		next.DriftRepair = driftRepairFor(node, cm)
	}
	if !c.set(name, prev, next) || held {
		return nil // unchanged; or held, and the pacer logged that the node waits: what it runs did not change
	}
	if c.onlyFactsChanged(name, prev, hadPrev, next) {
		return nil
	}
	c.log.Info("node assigned config", zap.String("node", name), zap.String("origin", string(origin)),
		zap.String("source", configmaps.Key(ref.Namespace, ref.Name)), zap.String("uid", string(cm.UID)),
		zap.String("resourceVersion", cm.ResourceVersion), zap.String("kubeletConfigKey", ref.KubeletConfigKey),
		zap.String("kubeletVersion", kubeletVersion), zap.Bool("drained", drained))
	return nil
}

// set sets node's state, prev before, and says when its preview changed; it reports whether the state
// changed.
func (c *Controller) set(node string, prev, next assignment.State) bool {
	if !c.table.Set(node, next) {
		return false
	}
	cur, _, _ := c.table.Get(node) // the table may have dropped a preview too large
	c.logPreview(node, prev.Preview, cur.Preview)
	return true
}

// setSyncError is table.SetSyncError, saying when the node's preview changed.
func (c *Controller) setSyncError(node string, f assignment.Facts, e nodeconfig.StatusError) bool {
	prev, _, _ := c.table.Get(node)
	if !c.table.SetSyncError(node, f, e) {
		return false
	}
	cur, _, _ := c.table.Get(node)
	c.logPreview(node, prev.Preview, cur.Preview)
	return true
}

// paceDone frees node's pacing slot or place in line: its source is no direct ConfigMap version now.
func (c *Controller) paceDone(node string) {
	if c.pacer != nil {
		c.pacer.Done(node)
	}
}

// onlyFactsChanged says whether next, set for node, differs from prev only in what it says of the Node
// object's kubelet. An in-place kubelet upgrade changes only the version the sidecar validates with: it is
// said, rather than an assignment nobody made announced. A new capacity (the node restarted with more
// memory, or other hugepages) is only passed on.
func (c *Controller) onlyFactsChanged(node string, prev assignment.State, hadPrev bool, next assignment.State) bool {
	if !hadPrev || !sameExceptVersion(prev, next) {
		return false
	}
	if prev.KubeletVersion != next.KubeletVersion {
		c.log.Info("node kubelet version changed; configs are validated with its minor", zap.String("node", node),
			zap.String("from", prev.KubeletVersion), zap.String("to", next.KubeletVersion))
	}
	return true
}

// sameExceptVersion reports whether a and b differ at most in the kubelet version, the node's capacity,
// its preview and a drift repair request (which set and setSyncError log, or the pool controller).
func sameExceptVersion(a, b assignment.State) bool {
	a.KubeletVersion, a.NodeCapacity, a.Preview, a.DriftRepair = b.KubeletVersion, b.NodeCapacity, b.Preview, b.DriftRepair
	return a.Same(b)
}

// factsOf is what node's state says of the Node object, whatever its source.
func factsOf(node *corev1.Node) assignment.Facts {
	f := assignment.Facts{NodeUID: string(node.UID), KubeletVersion: node.Status.NodeInfo.KubeletVersion}
	for r, q := range node.Status.Capacity {
		if !allocated(r) {
			continue
		}
		if f.NodeCapacity == nil {
			f.NodeCapacity = map[string]string{}
		}
		f.NodeCapacity[string(r)] = q.String()
	}
	return f
}

// allocated says whether the kubelet's allocatable of r follows from its capacity and the config: CPU,
// memory and hugepages, the capacity the sidecar's admission prediction reads. Pods are not (the kubelet
// reports maxPods as their capacity: each rollout of it would send every node its state again), nor are
// ephemeral storage and extended resources (a device plugin's count may change often).
func allocated(r corev1.ResourceName) bool {
	return r == corev1.ResourceCPU || r == corev1.ResourceMemory ||
		strings.HasPrefix(string(r), corev1.ResourceHugePagesPrefix)
}

// ResolvedConfigs is the number of ConfigMap versions held resolved.
func (c *Controller) ResolvedConfigs() int { return c.shared.size() }

// checkSnapshot refuses a ConfigMap that claims to be a KubeletConfigPool's revision snapshot and is not
// the one the pool created (revision.Verify): its data must be its revision's, and its UID the one the
// pool records; one the pool does not record is sent only to a node already running it. A node is never
// sent a refused one. Before the pools' records are listed, a claimed snapshot the node does not run yet
// is errRecordsPending: it cannot be told from one re-created a moment ago. The data's hash is computed
// once per ConfigMap version and record, not once per node.
func (c *Controller) checkSnapshot(node *corev1.Node, ref *corev1.ConfigMapNodeConfigSource,
	cm *corev1.ConfigMap) error {
	pool, rev, ok := revision.Claim(cm)
	if !ok {
		return nil
	}
	running := runs(node, cm.UID)
	var rec *v1alpha1.RevisionSnapshots
	exists := false
	if c.snapshots != nil {
		if !running && !c.snapshots.Synced() {
			return errRecordsPending
		}
		rec, exists = c.snapshots.Recorded(pool)
	}
	r, recorded := rec.Snapshot(rev)
	recorded = recorded && r.Namespace == cm.Namespace && r.Name == cm.Name
	if !running && !(recorded && r.UID == cm.UID) &&
		(exists && rec == nil || recordMayLag(node, cm, pool, rev, recorded, c.now())) {
		// Not (yet) the recorded object: wait rather than refuse where the record may be on its way.
		// Waiting never sends anything.
		return errRecordsPending
	}
	memo := string(cm.UID) + "/" + cm.ResourceVersion + "/" + r.Namespace + "/" + r.Name + "/" + string(r.UID) + "/" +
		r.KubeletConfigKey + "/" + strconv.FormatBool(running)
	return c.shared.check(ref, memo,
		func() error { return revision.Verify(cm, pool, rev, ref.KubeletConfigKey, rec, running) })
}

// errRecordsPending: the pools' snapshot records are not listed yet, or not up to the node's assignment
// (checkSnapshot).
var errRecordsPending = errors.New("kubeletconfigpool snapshot records not listed yet")

// recordsPendingRetry is how soon a node waiting for the pools' records is resolved again.
const recordsPendingRetry = time.Second

// recordLag bounds how long a node waits for this replica to see the pool's record of a snapshot: the
// watches lag by milliseconds; a record still missing or different after this is what it is, and the
// snapshot refused.
const recordLag = 30 * time.Second

// recordMayLag says whether the pool's record of cm may not have reached this replica yet, so that node
// waits for it (for up to recordLag) rather than be refused:
//   - The pool stores the record before it assigns a node the revision, but the two reach this replica on
//     separate watches, and the Node's may come first: the pool records nothing of the revision here
//     (recorded false), and node's dkc.dev/pool-assignment (dkc-server's alone to write: policy
//     dkc-node-status-writers) names pool's revision rev, assigned within recordLag of now.
//   - The pool creates a snapshot, then records it (a new revision, or one created again after the operator
//     deleted a refused object): cm was created within recordLag of now.
//
// A pool whose status predates the record (dkc-server upgraded, the new leader not yet started) is waited
// for without a bound by the caller: its new leader records what it adopts.
func recordMayLag(node *corev1.Node, cm *corev1.ConfigMap, pool, rev string, recorded bool, now time.Time) bool {
	if now.Sub(cm.CreationTimestamp.Time) < recordLag {
		return true
	}
	if recorded {
		return false // the record is here, and names another object
	}
	raw, ok := node.Annotations[v1alpha1.AnnotationAssignment]
	if !ok {
		return false
	}
	var a v1alpha1.Assignment
	if json.Unmarshal([]byte(raw), &a) != nil || a.Pool != pool || a.Revision != rev {
		return false
	}
	return now.Sub(a.Time.Time) < recordLag
}

// runs says whether the status dkc-server wrote for node names uid as the config it was assigned or runs.
func runs(node *corev1.Node, uid types.UID) bool {
	st, ok := reported(node)
	if !ok || uid == "" {
		return false
	}
	for _, s := range []*corev1.NodeConfigSource{st.Assigned, st.Active} {
		if s != nil && s.ConfigMap != nil && s.ConfigMap.UID == uid {
			return true
		}
	}
	return false
}

// sameCapacity compares two capacities' allocated resources by value (a kubelet status update rewrites them
// unchanged).
func sameCapacity(a, b corev1.ResourceList) bool {
	for _, pair := range [][2]corev1.ResourceList{{a, b}, {b, a}} {
		for r, q := range pair[0] {
			if p, ok := pair[1][r]; allocated(r) && (!ok || p.Cmp(q) != 0) {
				return false
			}
		}
	}
	return true
}

// driftRepairFor is the pool's request that node repair its drift, when one names the ConfigMap version cm
// the node is given and the drift the node shows now (DriftRepair.Live); nil otherwise: a request left from
// an earlier assignment or an earlier drift asks nothing, and one whose drift ended is withdrawn.
func driftRepairFor(node *corev1.Node, cm *corev1.ConfigMap) *dkcv1.DriftRepair {
	r, ok := nodeconfig.DriftRepairOf(node)
	if !ok || !r.For(cm.UID, cm.ResourceVersion) || !r.Live(node) {
		return nil
	}
	return &dkcv1.DriftRepair{Id: r.ID(), Cause: r.Cause}
}
