// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/test/devcluster"
)

// The pool phase is issue 27's figure: a KubeletConfigPool with maxUnavailable 10% rolled out by
// dkc-server's pool controller (under leader election, as deployed) to PoolNodes simulated nodes — how long
// it takes, and how many nodes were in progress at once, by the pool's own status and, independently, by
// the Nodes.
const (
	poolName = "bench-pool"
	// poolConfig is the ConfigMap the pool rolls out; its snapshots are named <poolName>-<revision>.
	poolConfig = "bench-pool-config"
	// poolLabel selects the pool's nodes, and only them.
	poolLabel          = "dkc.dev/bench-pool"
	poolMaxUnavailable = "10%"
	// poolLimit bounds the rollout: 10 slots' worth of trials (Config.Trial) take a few minutes here.
	poolLimit = 15 * time.Minute
	// poolSample is how often the pool's status is read.
	poolSample = 250 * time.Millisecond
)

// poolLimitOf is maxUnavailable resolved on n selected nodes as the planner resolves it: a percentage
// rounds down, at least 1 (docs/design.md, "KubeletConfigPool").
func poolLimitOf(maxUnavailable intstr.IntOrString, n int) (int, error) {
	v, err := intstr.GetScaledValueFromIntOrPercent(&maxUnavailable, n, false)
	if err != nil {
		return 0, fmt.Errorf("resolve maxUnavailable %s on %d nodes: %w", maxUnavailable.String(), n, err)
	}
	return max(v, 1), nil
}

// pool labels PoolNodes nodes and marks them Ready (the planner assigns Ready nodes only; no kubelet posts
// a simulated node's status), runs exactly their simulated nodes, quiet on the shared ConfigMap, then
// creates a pool selecting them and follows it until Updated. Each status sample gives the pool's own
// in-progress count; a Node watch gives the Nodes' count after every change. Cleaned up after: the pool
// deleted, the nodes back on the shared ConfigMap without label or assignment record, the pool's
// ConfigMaps (source and snapshots) deleted, the simulated nodes stopped.
func (r *run) pool(ctx context.Context) error {
	nodes := r.nodes[:r.cfg.PoolNodes]
	maxUnavailable := intstr.FromString(poolMaxUnavailable)
	limit, err := poolLimitOf(maxUnavailable, len(nodes))
	if err != nil {
		return err
	}
	// Only the pool's nodes run: the max phase leaves every node connected, and thousands of idle
	// sidecars beside the rollout would measure this machine's cores.
	in := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		in[n] = true
	}
	r.simsMu.Lock()
	others := false
	for n := range r.sims {
		others = others || !in[n]
	}
	r.simsMu.Unlock()
	if others {
		r.stopSims()
	}
	if err := r.allOnShared(ctx); err != nil {
		return err
	}
	if err := r.markPoolNodes(ctx, nodes); err != nil {
		return err
	}
	if err := r.connect(ctx, nodes); err != nil {
		return err
	}
	if err := r.rec.wait(ctx, nodes, cmShared, r.cmRV[cmShared], 5*time.Minute); err != nil {
		return err
	}
	if err := r.waitConnected(ctx); err != nil {
		return err
	}
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	if err := r.createConfigMaps(ctx, []string{poolConfig}, kubeletConfig); err != nil {
		return err
	}
	if err := r.waitPoolLeader(ctx); err != nil {
		return err
	}
	counter := newInProgressCounter()
	stopWatching, err := r.watchPoolNodes(ctx, counter)
	if err != nil {
		return err
	}
	defer stopWatching()
	dyn, err := dynamic.NewForConfig(r.rc) // JSON: CRDs speak no protobuf
	if err != nil {
		return fmt.Errorf("create dynamic client: %w", err)
	}
	pools := dyn.Resource(devcluster.PoolResource)

	maxFailures := int32(1)
	// The gates on: every batch's nodes have their pods listed until they pass (the simulated nodes run
	// none), and a drain would start on a sidecar's word (none asks: the config needs no state reset).
	gates := &v1alpha1.Disruption{Drain: v1alpha1.DrainAllowed}
	if r.cfg.PoolGatesOff {
		gates = &v1alpha1.Disruption{Drain: v1alpha1.DrainNever, PodReadinessTimeout: &metav1.Duration{}}
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&v1alpha1.KubeletConfigPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "KubeletConfigPool"},
		ObjectMeta: metav1.ObjectMeta{Name: poolName},
		Spec: v1alpha1.KubeletConfigPoolSpec{
			NodeSelector:   metav1.LabelSelector{MatchLabels: map[string]string{poolLabel: "true"}},
			ConfigMap:      v1alpha1.ConfigMapReference{Namespace: namespace, Name: poolConfig, KubeletConfigKey: "kubelet"},
			MaxUnavailable: &maxUnavailable, MaxFailures: &maxFailures, Disruption: gates,
		},
	})
	if err != nil {
		return err
	}
	r.progress("pool: rolling %s out to %d nodes, maxUnavailable %s (%d), trial %v, workload gates off: %v",
		poolConfig, len(nodes), poolMaxUnavailable, limit, r.cfg.Trial, r.cfg.PoolGatesOff)
	created := time.Now()
	if _, err := pools.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create kubeletconfigpool %s: %w", poolName, err)
	}
	f, err := r.followPool(ctx, pools, created)
	if err == nil {
		err = r.poolFigures(ctx, counter, f, created, len(nodes), limit)
	}
	if err != nil {
		// The run ends here, and its cluster with it: only the pool goes, so that no later sync acts on it.
		_ = pools.Delete(context.Background(), poolName, metav1.DeleteOptions{})
		return err
	}
	stopWatching()
	return r.cleanUpPool(ctx, pools, nodes)
}

// poolFollowed is what sampling the pool's status found.
type poolFollowed struct {
	pool        *v1alpha1.KubeletConfigPool // the last sample: Updated
	updated     time.Time
	maxStatus   int32 // status.nodes.inProgress, the most of any sample
	maxFailed   int32
	samples     int
	getFailures int
}

// followPool reads the pool every poolSample until its Updated condition is True for its current
// generation, or fails at poolLimit, or when it halts (a node failed the revision: the figure would not be
// a rollout's).
func (r *run) followPool(ctx context.Context, pools dynamic.ResourceInterface,
	created time.Time) (poolFollowed, error) {
	var f poolFollowed
	deadline := created.Add(poolLimit)
	lastProgress := time.Now()
	var lastErr error
	for {
		p, err := getPool(ctx, pools)
		if err != nil {
			// A busy apiserver's hiccup must not cost a run of many minutes: the limit decides.
			f.getFailures++
			lastErr = err
		} else {
			f.samples++
			f.pool = p
			f.maxStatus = max(f.maxStatus, p.Status.Nodes.InProgress)
			f.maxFailed = max(f.maxFailed, p.Status.Nodes.Failed)
			if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionHalted); c != nil &&
				c.Status == metav1.ConditionTrue {
				return f, fmt.Errorf("kubeletconfigpool %s halted after %v: %s (failed nodes %s)%s", poolName,
					time.Since(created).Round(time.Second), c.Message, failedNodes(p), r.rec.failure())
			}
			if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionConfigInvalid); c != nil &&
				c.Status == metav1.ConditionTrue {
				return f, fmt.Errorf("kubeletconfigpool %s: its config is invalid: %s: %s", poolName, c.Reason, c.Message)
			}
			if p.Status.ObservedGeneration == 0 && time.Since(created) > 2*time.Minute {
				// The leader was seen before the pool was created: a controller that syncs nothing is broken.
				return f, fmt.Errorf("kubeletconfigpool %s has no status %v after its creation: dkc-server's pool controller did "+
					"not sync it (see dkc-server's log)",
					poolName, time.Since(created).Round(time.Second))
			}
			if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionUpdated); c != nil &&
				c.Status == metav1.ConditionTrue && p.Status.ObservedGeneration == p.Generation {
				f.updated = time.Now()
				return f, nil
			}
			if time.Since(lastProgress) >= 10*time.Second {
				lastProgress = time.Now()
				n := p.Status.Nodes
				r.progress("pool: %d of %d nodes updated, %d in progress, %d failed (revision %q)", n.Updated, n.Selected,
					n.InProgress, n.Failed, p.Status.CurrentRevision)
			}
		}
		if time.Now().After(deadline) {
			if f.pool == nil {
				return f, fmt.Errorf("kubeletconfigpool %s never read in %v: %w", poolName, poolLimit, lastErr)
			}
			p := f.pool
			return f, fmt.Errorf("kubeletconfigpool %s not Updated after %v: generation %d observed %d, revision "+
				"%q, nodes %+v, conditions %s%s",
				poolName, poolLimit, p.Generation, p.Status.ObservedGeneration, p.Status.CurrentRevision, p.Status.Nodes,
				conditions(p), r.rec.failure())
		}
		select {
		case <-ctx.Done():
			return f, ctx.Err()
		case <-time.After(poolSample):
		}
	}
}

func getPool(ctx context.Context, pools dynamic.ResourceInterface) (*v1alpha1.KubeletConfigPool, error) {
	u, err := pools.Get(ctx, poolName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get kubeletconfigpool %s: %w", poolName, err)
	}
	var p v1alpha1.KubeletConfigPool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		return nil, fmt.Errorf("decode kubeletconfigpool %s: %w", poolName, err)
	}
	return &p, nil
}

func failedNodes(p *v1alpha1.KubeletConfigPool) string {
	var out []string
	for _, n := range p.Status.FailedNodes {
		out = append(out, fmt.Sprintf("%s: %s %s", n.Name, n.Reason, n.Error))
	}
	return "[" + strings.Join(out, "; ") + "]"
}

func conditions(p *v1alpha1.KubeletConfigPool) string {
	var out []string
	for _, c := range p.Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return "[" + strings.Join(out, "; ") + "]"
}

// poolFigures records the rollout's figures: its time is from the pool's creation to the first sample that
// shows it Updated (at most poolSample late), the first assignment's from the creation to the Node watch
// showing a node assigned the revision. The Nodes' count is the counter's most on the revision's
// snapshot; it is waited for (briefly) to show every node proven, as the pool's status already does, so
// that a watch that fell behind or a counter that misjudges nodes shows here rather than as a figure.
func (r *run) poolFigures(ctx context.Context, counter *inProgressCounter, f poolFollowed, created time.Time, n,
	limit int) error {
	p := f.pool
	snapshot := sourceKey(namespace, poolName+"-"+p.Status.CurrentRevision, "kubelet")
	r.res.set("pool_nodes", float64(n))
	r.res.set("pool_max_unavailable", float64(limit))
	r.res.set("pool_rollout_seconds", f.updated.Sub(created).Seconds())
	// Batches of maxUnavailable nodes, each a trial long at least: the controller's own time per batch is
	// what is left of this beyond the trial, and what turning the gates on adds shows against a run with
	// -pool-gates-off.
	batches := (n + limit - 1) / limit
	r.res.note("pool_seconds_per_batch", f.updated.Sub(created).Seconds()/float64(batches))
	if r.cfg.PoolGatesOff {
		r.res.note("pool_gates_on", 0)
	} else {
		r.res.note("pool_gates_on", 1)
	}
	r.res.set("pool_max_in_progress_by_status", float64(f.maxStatus))
	r.res.set("pool_failed_nodes", float64(max(f.maxFailed, p.Status.Nodes.Failed)))
	r.res.note("pool_trial_seconds", r.cfg.Trial.Seconds())
	r.res.note("pool_status_samples", float64(f.samples))
	r.res.note("pool_status_read_failures", float64(f.getFailures))
	var settled error
	if p.Status.Nodes.Selected != int32(n) || p.Status.Nodes.Updated != int32(n) {
		settled = fmt.Errorf("kubeletconfigpool %s is Updated with nodes %+v, want all %d selected and updated", poolName,
			p.Status.Nodes, n)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		s := counter.summary(snapshot)
		if settled != nil || s.assigned == n && s.inProgress == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			settled = fmt.Errorf("the pool is Updated, but its Nodes show %d of %d assigned %s and %d of those not yet proven",
				s.assigned, n, snapshot, s.inProgress)
			break
		}
	}
	s := counter.summary(snapshot)
	r.res.set("pool_max_in_progress_by_nodes", float64(s.max))
	r.res.setGoal("pool_max_in_progress", goal{Op: "<=", Value: float64(limit)})
	r.res.set("pool_max_in_progress", float64(max(int(f.maxStatus), s.max)))
	if !s.first.IsZero() {
		r.res.note("pool_first_assignment_seconds", s.first.Sub(created).Seconds())
	}
	r.res.note("pool_node_events", float64(counter.eventCount()))
	r.progress("pool: %d nodes updated in %.1f s (first assigned after %.1f s); at most %d in progress by the pool's "+
		"status, %d by the Nodes; maxUnavailable %d",
		n, f.updated.Sub(created).Seconds(), s.first.Sub(created).Seconds(), f.maxStatus, s.max, limit)
	if settled != nil {
		return settled
	}
	if s.max == 0 || f.maxStatus == 0 {
		// Nothing ever in progress would make the goal vacuous: the counting is broken, not the pool.
		return fmt.Errorf("no node was ever seen in progress (%d by the pool's status, %d by the Nodes)", f.maxStatus, s.max)
	}
	return nil
}

// waitPoolLeader waits until a dkc-server holds the pool controller's Lease (docs/design.md, "Leader
// election"): the bench's dkc-server runs with the Deployment's flags, which leave leader election on, and a
// dkc-server restarted by an earlier phase leads again once the Lease is released or expires (15 s). Lease
// name and namespace are dkc-server's defaults as devcluster starts it (--namespace), unless the flags say
// otherwise; with --leader-elect=false there is nothing to wait for.
func (r *run) waitPoolLeader(ctx context.Context) error {
	id, ns := "dkc-server-pools", devcluster.SidecarNamespace
	for _, a := range r.res.ServiceArgs {
		switch {
		case a == "--leader-elect=false":
			return nil
		case strings.HasPrefix(a, "--leader-election-id="):
			id = strings.TrimPrefix(a, "--leader-election-id=")
		case strings.HasPrefix(a, "--leader-election-namespace="):
			ns = strings.TrimPrefix(a, "--leader-election-namespace=")
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := r.client.CoordinationV1().Leases(ns).Get(ctx, id, metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && l.Spec.RenewTime != nil &&
			l.Spec.LeaseDurationSeconds != nil &&
			time.Since(l.Spec.RenewTime.Time) < time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
			r.progress("pool: the pool controller leads as %s (Lease %s/%s)", *l.Spec.HolderIdentity, ns, id)
			return nil
		}
		if time.Now().After(deadline) {
			state := "no holder, or not renewed"
			if err != nil {
				state = err.Error()
			}
			return fmt.Errorf("no dkc-server leads the pool controller a minute on: Lease %s/%s: %s (see dkc-server's log)", ns,
				id, state)
		}
		time.Sleep(time.Second)
	}
}

// markPoolNodes labels nodes for the pool's selector and marks them Ready, as a healthy node's kubelet
// would (devcluster does the same for its simulated nodes; no node lifecycle controller undoes it).
func (r *run) markPoolNodes(ctx context.Context, nodes []string) error {
	label, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{poolLabel: "true"}}})
	now := metav1.Now()
	ready, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "simulated node",
		LastHeartbeatTime: now, LastTransitionTime: now}}}})
	start := time.Now()
	err := parallel(ctx, nodes, 32, func(ctx context.Context, _ int, n string) error {
		if _, err := r.client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, label, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label node %s for the pool: %w", n, err)
		}
		if _, err := r.client.CoreV1().Nodes().Patch(ctx, n, types.StrategicMergePatchType, ready, metav1.PatchOptions{},
			"status"); err != nil {
			return fmt.Errorf("mark node %s Ready: %w", n, err)
		}
		return nil
	})
	r.progress("pool: labelled %d Nodes and marked them Ready in %v", len(nodes),
		time.Since(start).Round(time.Millisecond))
	return err
}

// watchPoolNodes feeds counter every change of the pool's Nodes from one watch (an informer: one event
// handler, in the order the apiserver sent them) until the returned func is called; it returns once the
// watch has listed them.
func (r *run) watchPoolNodes(ctx context.Context, counter *inProgressCounter) (func(), error) {
	lw := cache.NewFilteredListWatchFromClient(r.client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.LabelSelector = poolLabel + "=true" })
	inf := cache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, cache.Indexers{})
	_ = inf.SetTransform(func(obj any) (any, error) {
		if n, ok := obj.(*corev1.Node); ok {
			n.ManagedFields = nil
		}
		return obj, nil
	})
	observe := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			counter.observe(n, time.Now())
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				counter.forget(n.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	ictx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); inf.Run(ictx.Done()) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		stop()
		return nil, errors.New("the pool's Node watch did not list them")
	}
	return stop, nil
}

// cleanUpPool leaves nothing of the phase for a later one: the pool is deleted, its nodes lose the label
// and the assignment record and go back to the shared ConfigMap (waited for as last-known-good, so that no
// node uses a snapshot any more), the pool's ConfigMaps are deleted (dkc-server's controller collects
// snapshots only when it syncs the gone pool, and on its 10-minute sweep), and the simulated nodes stop.
func (r *run) cleanUpPool(ctx context.Context, pools dynamic.ResourceInterface, nodes []string) error {
	if err := pools.Delete(ctx, poolName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete kubeletconfigpool %s: %w", poolName, err)
	}
	// No finalizer: gone at once, but wait all the same, so that no node change below meets it.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := pools.Get(ctx, poolName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubeletconfigpool %s still there a minute after its deletion (%w)", poolName, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	unmark, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]any{poolLabel: nil}, "annotations": map[string]any{v1alpha1.AnnotationAssignment: nil}}})
	if err := parallel(ctx, nodes, 32, func(ctx context.Context, _ int, n string) error {
		if _, err := r.client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, unmark,
			metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("remove node %s from the pool: %w", n, err)
		}
		return r.pointAt(ctx, n, cmShared)
	}); err != nil {
		return err
	}
	if err := r.waitLastKnownGood(ctx, nodes, cmShared, r.cmRV[cmShared]); err != nil {
		return err
	}
	cms := r.client.CoreV1().ConfigMaps(namespace)
	if err := cms.DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: v1alpha1.LabelPool + "=" + poolName}); err != nil {
		return fmt.Errorf("delete the revisions of kubeletconfigpool %s: %w", poolName, err)
	}
	if err := cms.Delete(ctx, poolConfig, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete configmap %s: %w", poolConfig, err)
	}
	delete(r.cmRV, poolConfig)
	r.stopSims()
	return nil
}

// sourceKey names a ConfigMap config source: namespace, name and kubelet config key, as a pool's
// snapshot is compared (a snapshot is immutable and named by its content, so no resourceVersion).
func sourceKey(namespace, name, key string) string { return namespace + "/" + name + "/" + key }

func keyOf(s *corev1.NodeConfigSource) string {
	if s == nil || s.ConfigMap == nil {
		return ""
	}
	return sourceKey(s.ConfigMap.Namespace, s.ConfigMap.Name, s.ConfigMap.KubeletConfigKey)
}

// nodeProgress reads a Node alone: the ConfigMap source it is assigned ("" for its local config or a source
// that does not parse), and whether it is in progress on it — its status (dkc.dev/config-status, as
// dkc-server wrote it) does not show that source both active and last-known-good. The planner's rule for
// proven, without its code: a node that refused the source counts as in progress here (the pool counts it
// failed), which can only raise this count, and a failure halts the phase anyway.
func nodeProgress(n *corev1.Node) (source string, inProgress bool) {
	src := n.Spec.ConfigSource // read first where the apiserver keeps it, as dkc-server does
	if src == nil {
		raw, ok := n.Annotations[nodeconfig.SourceAnnotation]
		if !ok {
			return "", false
		}
		var s corev1.NodeConfigSource
		if json.Unmarshal([]byte(raw), &s) != nil {
			return "", false
		}
		src = &s
	}
	source = keyOf(src)
	if source == "" {
		return "", false
	}
	var st corev1.NodeConfigStatus
	if raw, ok := n.Annotations[nodeconfig.StatusAnnotation]; !ok || json.Unmarshal([]byte(raw), &st) != nil {
		return source, true
	}
	return source, keyOf(st.Active) != source || keyOf(st.LastKnownGood) != source
}

// inProgressCounter follows Nodes change by change and counts, per config source, the Nodes assigned it
// and those of them in progress (nodeProgress). Fed by one watch, the counts after each change are those
// of a state the Nodes were in, in the apiserver's order: the most in progress is over every state the
// watch passed through, not over samples (and needs no revision known in advance: the snapshot's name
// shows in the pool's status only once nodes may already be assigned it).
type inProgressCounter struct {
	mu       sync.Mutex
	nodes    map[string]nodeState
	assigned map[string]int // by source
	progress map[string]int
	most     map[string]int
	first    map[string]time.Time // when a node was first seen assigned the source
	events   int
}

type nodeState struct {
	source     string
	inProgress bool
}

func newInProgressCounter() *inProgressCounter {
	return &inProgressCounter{nodes: map[string]nodeState{}, assigned: map[string]int{}, progress: map[string]int{},
		most: map[string]int{}, first: map[string]time.Time{}}
}

// observe takes a Node as it is now (seen at).
func (c *inProgressCounter) observe(n *corev1.Node, at time.Time) {
	source, inProgress := nodeProgress(n)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
	c.set(n.Name, nodeState{source: source, inProgress: inProgress})
	if _, ok := c.first[source]; source != "" && !ok {
		c.first[source] = at
	}
}

// forget takes a Node that is gone (or no longer selected).
func (c *inProgressCounter) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
	c.set(name, nodeState{})
}

func (c *inProgressCounter) set(name string, s nodeState) {
	if old, ok := c.nodes[name]; ok && old.source != "" {
		c.assigned[old.source]--
		if old.inProgress {
			c.progress[old.source]--
		}
	}
	if s.source == "" {
		delete(c.nodes, name)
		return
	}
	c.nodes[name] = s
	c.assigned[s.source]++
	if s.inProgress {
		c.progress[s.source]++
		c.most[s.source] = max(c.most[s.source], c.progress[s.source])
	}
}

type sourceSummary struct {
	assigned, inProgress, max int
	first                     time.Time
}

// summary is source's counts now, its most in progress and when it was first assigned.
func (c *inProgressCounter) summary(source string) sourceSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	return sourceSummary{assigned: c.assigned[source], inProgress: c.progress[source], max: c.most[source],
		first: c.first[source]}
}

func (c *inProgressCounter) eventCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events
}
