// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodedrain"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
)

// A pool with spec.disruption.drain Allowed drains a node when the node itself says it must: its sidecar
// refused the revision before touching the kubelet (nodeconfig.DrainRequiredError), as the kubelet would
// refuse it on the state its resource managers checkpointed, or would evict pods under its new eviction
// thresholds. The node, assigned, counts as in progress
// throughout (plan: ReasonDraining). The controller then cordons it (marked nodedrain.CordonedAnnotation
// "pool/NAME", unless someone else cordoned it), evicts its pods (kubectl's drain: the Eviction API), and
// marks it drained for the snapshot's version: the sidecar then removes the state with the kubelet
// stopped and restarts it. Once the node runs the revision, or failed it, the marks go and the node is
// uncordoned if the pool cordoned it. Everything the drain needs to go on is on the Node (its assignment,
// status and marks), so a new leader takes over a drain in progress where the last one stopped:
// evicting again what is left, never what came back (nothing schedules onto a cordoned node).

// drainJob is one node's drain, run by its own goroutine.
type drainJob struct {
	pool, revision string
	cancel         context.CancelFunc
	// Guarded by drains.mu:
	phase  string // what it does now, for the verdict's detail
	failed string // why it failed; "" unless it did
	done   bool
}

// drains are the controller's drain jobs, by node.
type drains struct {
	mu   sync.Mutex
	jobs map[string]*drainJob
}

func newDrains() *drains { return &drains{jobs: map[string]*drainJob{}} }

// of is what the planner sees of node's drain for pool's revision.
func (d *drains) of(pool, revision, node string) (phase, failed string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	j, ok := d.jobs[node]
	if !ok || j.pool != pool || j.revision != revision {
		return "", ""
	}
	return j.phase, j.failed
}

func (d *drains) set(j *drainJob, phase, failed string, done bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	j.phase, j.failed, j.done = phase, failed, done
}

// forget ends node's job, if any.
func (d *drains) forget(node string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if j, ok := d.jobs[node]; ok {
		j.cancel()
		delete(d.jobs, node)
	}
}

// stopAll ends every job (the term ends: the next leader takes them over).
func (d *drains) stopAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for n, j := range d.jobs {
		j.cancel()
		delete(d.jobs, n)
	}
}

// cordonedBy is what the pool writes into nodedrain.CordonedAnnotation.
func cordonedBy(pool string) string { return "pool/" + pool }

// drainNodes starts the drains the verdicts ask for and releases the nodes done with theirs, and those the
// pool no longer selects. It runs after the status is written: a drain that failed is recorded
// (status.failedNodes) before its node is released.
func (c *Controller) drainNodes(ctx context.Context, pool *v1alpha1.KubeletConfigPool, target plan.Target,
	verdicts []plan.Verdict, byName map[string]*corev1.Node, all []*corev1.Node) {
	for _, v := range verdicts {
		n := byName[v.Name]
		if n == nil {
			continue
		}
		switch {
		case v.State == plan.InProgress && v.Reason == plan.ReasonDraining:
			c.startDrain(pool, target.For(n.Name), n)
		case waitsForKubelet(v):
			// Marked drained: the sidecar resets the state and restarts the kubelet; released once it runs it.
		case drainedBy(n, pool.Name):
			c.release(ctx, pool.Name, n.Name, string(v.State)+"/"+v.Reason)
		}
	}
	for _, n := range all {
		if byName[n.Name] == nil && drainedBy(n, pool.Name) {
			c.release(ctx, pool.Name, n.Name, "no longer selected")
		}
	}
}

// drainedBy says whether node n carries pool's drain: its cordon, or a drained mark while the pool
// assigned it (a node someone else had cordoned gets the mark alone).
func drainedBy(n *corev1.Node, pool string) bool {
	if n.Annotations[nodedrain.CordonedAnnotation] == cordonedBy(pool) {
		return true
	}
	a, ok := assignmentOf(n)
	return n.Annotations[nodeconfig.DrainedAnnotation] != "" && ok && a.Pool == pool
}

// releaseGone releases the nodes a deleted pool had drained.
func (c *Controller) releaseGone(ctx context.Context, pool string) {
	nodes, _ := c.nodes.List(labels.Everything()) // a cache's List never fails
	for _, n := range nodes {
		if n.Annotations[nodedrain.CordonedAnnotation] == cordonedBy(pool) {
			c.release(ctx, pool, n.Name, "pool deleted")
		}
	}
}

// waitsForKubelet: in progress towards the target, and not running it yet (the sidecar checks, resets the
// state, restarts the kubelet): a node released now could take pods the kubelet then loses (a rollback
// resets the state again).
func waitsForKubelet(v plan.Verdict) bool {
	return v.State == plan.InProgress && (v.Reason == plan.ReasonNotActive || v.Reason == plan.ReasonRetrying ||
		v.Reason == plan.ReasonNotReported)
}

// startDrain starts node's drain for the target unless one runs or ran for it.
func (c *Controller) startDrain(pool *v1alpha1.KubeletConfigPool, target plan.Target, n *corev1.Node) {
	c.drains.mu.Lock()
	if j, ok := c.drains.jobs[n.Name]; ok {
		if j.pool == pool.Name && j.revision == target.Revision {
			c.drains.mu.Unlock()
			return
		}
		j.cancel() // another pool's or revision's: this one is the node's now
	}
	ctx, cancel := context.WithTimeout(c.runCtx, pool.Spec.DrainTimeoutOrDefault())
	j := &drainJob{pool: pool.Name, revision: target.Revision, cancel: cancel, phase: "cordoning the node"}
	c.drains.jobs[n.Name] = j
	c.drains.mu.Unlock()
	c.log.Info("draining node: its sidecar says the revision needs it", zap.String("pool", pool.Name),
		zap.String("node", n.Name), zap.String("revision", target.Revision),
		zap.Duration("drainTimeout", pool.Spec.DrainTimeoutOrDefault()))
	go func() {
		defer cancel()
		err := c.drain(ctx, j, pool.Name, target, n.Name, pool.Spec.DrainTimeoutOrDefault())
		switch {
		case err == nil:
			c.drains.set(j, "drained; the sidecar restarts the kubelet (removing the state the change invalidates, "+
				"if any)", "", true)
			c.log.Info("node drained and marked; its sidecar goes on", zap.String("pool", pool.Name),
				zap.String("node", n.Name), zap.String("revision", target.Revision))
		case c.runCtx.Err() != nil:
			return // the term ended: the next leader takes the drain over
		default:
			c.drains.set(j, "", err.Error(), true)
			c.log.Warn("drain of node failed", zap.String("pool", pool.Name), zap.String("node", n.Name),
				zap.String("revision", target.Revision), zap.Error(err))
		}
		c.queue.Add(pool.Name)
	}()
}

// drain is one drain job's work: cordon, evict, mark.
func (c *Controller) drain(ctx context.Context, j *drainJob, pool string, target plan.Target, node string,
	timeout time.Duration) error {
	d := c.drainer(timeout)
	if _, err := d.Cordon(ctx, node, cordonedBy(pool)); err != nil {
		return err
	}
	c.drains.set(j, "cordoned; evicting its pods (PodDisruptionBudgets hold)", "", false)
	if err := d.Drain(ctx, node); err != nil {
		if ctx.Err() != nil && c.runCtx.Err() == nil {
			return fmt.Errorf("drain of node %s not done within drainTimeout %v: %w", node, timeout, err)
		}
		return err
	}
	snap, err := c.snapshot(target.Source.Namespace, target.Source.Name)
	if err != nil {
		return err
	}
	return d.Mark(ctx, node, snap.UID, snap.ResourceVersion)
}

// drainer drains through the controller's client; what kubectl's drain prints goes to the debug log.
func (c *Controller) drainer(timeout time.Duration) *nodedrain.Drainer {
	return &nodedrain.Drainer{Client: c.cfg.Client, FieldManager: FieldManager, Timeout: timeout,
		Out: zapWriter{c.log.Named("drain")}, ErrOut: zapWriter{c.log.Named("drain")}}
}

// snapshot is the revision snapshot namespace/name from the controller's cache.
func (c *Controller) snapshot(namespace, name string) (*corev1.ConfigMap, error) {
	inf, ok := c.snapshots[namespace]
	if !ok {
		return nil, fmt.Errorf("snapshot %s/%s: namespace not watched", namespace, name)
	}
	obj, exists, err := inf.GetIndexer().GetByKey(namespace + "/" + name)
	if err != nil || !exists {
		return nil, fmt.Errorf("snapshot %s/%s not in the cache (%w)", namespace, name, err)
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return nil, fmt.Errorf("snapshot %s/%s: unexpected %T", namespace, name, obj)
	}
	return cm, nil
}

// release ends the pool's drain of a node done with it (it runs the revision, failed it, left the pool,
// or the pool is gone): its job stops, its marks go, and it is uncordoned if the pool cordoned it.
func (c *Controller) release(ctx context.Context, pool, node, why string) {
	c.drains.forget(node)
	if err := c.drainer(0).Release(ctx, node, cordonedBy(pool)); err != nil {
		// The next sync tries again: the node's marks are still there.
		c.log.Warn("release drained node", zap.String("pool", pool), zap.String("node", node), zap.Error(err))
		c.queue.AddAfter(pool, 5*time.Second)
		return
	}
	c.log.Info("node released after its drain", zap.String("pool", pool), zap.String("node", node),
		zap.String("why", why))
}

// zapWriter logs each write (a line of kubectl's drain) at debug level.
type zapWriter struct{ log *zap.Logger }

func (w zapWriter) Write(p []byte) (int, error) {
	w.log.Debug(string(p))
	return len(p), nil
}
