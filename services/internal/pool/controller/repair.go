// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
)

// EventRepairingDrift is the reason of the Event a pool records when it asks nodes to repair their drift.
const EventRepairingDrift = "RepairingDrift"

// This file asks nodes to repair their drift (spec.drift.policy Restore): the plan picks them
// (plan.Plan.Repair), and the controller writes each Node's nodeconfig.DriftRepairAnnotation, bound to the
// ConfigMap version the node runs and to the cause its ConfigDrift condition names. dkc-server's node
// controller sends it to the node's sidecar, which repairs once (docs/pools.md, "Drift").

// repairOf is the pool's request that n repair its drift when it names the ConfigMap version n runs (its
// status's active config); nil otherwise.
func repairOf(n *corev1.Node, st corev1.NodeConfigStatus) *nodeconfig.DriftRepair {
	r, ok := nodeconfig.DriftRepairOf(n)
	if !ok || st.Active == nil || st.Active.ConfigMap == nil ||
		!r.For(st.Active.ConfigMap.UID, st.Active.ConfigMap.ResourceVersion) {
		return nil
	}
	return &r
}

// repairsAsked are the drift repairs this controller asked for that its Node cache may not show yet, by
// node: the next decision must count those nodes in progress, not give their slot again.
type repairsAsked struct {
	mu sync.Mutex
	m  map[string]nodeconfig.DriftRepair
}

// cacheLag bounds how long the Node cache may take to show a request this controller wrote: a request
// remembered longer (its Node changed meanwhile, or is gone) is forgotten.
const cacheLag = time.Minute

// of is the request the node's view should see: what it shows, or the one asked after it, while that one
// is for the version the node runs (st) and younger than cacheLag.
func (r *repairsAsked) of(node string, st corev1.NodeConfigStatus, shown *nodeconfig.DriftRepair,
	now time.Time) *nodeconfig.DriftRepair {
	r.mu.Lock()
	defer r.mu.Unlock()
	asked, ok := r.m[node]
	if !ok {
		return shown
	}
	current := st.Active != nil && st.Active.ConfigMap != nil &&
		asked.For(st.Active.ConfigMap.UID, st.Active.ConfigMap.ResourceVersion)
	caughtUp := shown != nil && !shown.RequestTime.Before(asked.RequestTime)
	if caughtUp || !current || now.Sub(asked.RequestTime) > cacheLag {
		delete(r.m, node) // the cache caught up, or the node moved on
		return shown
	}
	return &asked
}

// asked remembers req, written for node.
func (r *repairsAsked) asked(node string, req nodeconfig.DriftRepair) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]nodeconfig.DriftRepair{}
	}
	r.m[node] = req
}

// askRepairs writes the drift repair requests of the nodes the plan picked, and records one Event for
// those it asked, even when a write fails. Each write is conditional on the Node's resourceVersion as
// decided on: a Node changed since (its drift gone, another assignment) is asked nothing.
func (c *Controller) askRepairs(ctx context.Context, pool *v1alpha1.KubeletConfigPool, target plan.Target,
	nodes []string, byName map[string]*corev1.Node, now time.Time) error {
	var asked []string
	defer func() {
		if len(asked) > 0 {
			c.cfg.Recorder.Eventf(pool, corev1.EventTypeNormal, EventRepairingDrift,
				"asked %d node(s) to repair their kubelet config drift (spec.drift.policy Restore): %s", len(asked),
				capped(asked))
		}
	}()
	for _, name := range nodes {
		n := byName[name]
		if n == nil {
			continue
		}
		st := statusOf(n)
		cause, since, ok := nodeconfig.DriftOf(n)
		if st.Active == nil || st.Active.ConfigMap == nil || !ok {
			continue // what the plan saw is gone
		}
		req := nodeconfig.DriftRepair{Cause: cause, UID: st.Active.ConfigMap.UID,
			ResourceVersion: st.Active.ConfigMap.ResourceVersion, RequestTime: now, DriftSince: since}
		if prev := repairOf(n, st); prev != nil {
			// The causes asked for on this version stay asked: none is asked for twice.
			req.Asked = prev.Asked
			if !slices.Contains(req.Asked, prev.Cause) && prev.Cause != cause {
				req.Asked = append(slices.Clone(req.Asked), prev.Cause)
			}
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": n.ResourceVersion,
			"annotations":     map[string]string{nodeconfig.DriftRepairAnnotation: nodeconfig.MarshalDriftRepair(req)},
		}})
		if err != nil {
			return err
		}
		c.repairs.asked(name, req)
		if _, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			c.repairs.forget(name, req)
			return fmt.Errorf("ask node %s to repair its drift (%s) for pool %s: %w", name, cause, pool.Name, err)
		}
		c.log.Info("asked node to repair its kubelet config drift", zap.String("pool", pool.Name),
			zap.String("node", name), zap.String("cause", cause), zap.String("revision", target.For(name).Revision),
			zap.String("uid", string(req.UID)), zap.String("resourceVersion", req.ResourceVersion))
		asked = append(asked, name+" ("+cause+")")
	}
	return nil
}

// forget drops req, asked for node, after its write failed.
func (r *repairsAsked) forget(node string, req nodeconfig.DriftRepair) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.m[node]; ok && cur.RequestTime.Equal(req.RequestTime) {
		delete(r.m, node)
	}
}

// withdrawRepairs removes the standing repair requests of the nodes the plan names (their pool no longer
// restores drift), each conditional on the Node's resourceVersion as decided on.
func (c *Controller) withdrawRepairs(ctx context.Context, pool *v1alpha1.KubeletConfigPool, nodes []string,
	byName map[string]*corev1.Node) error {
	for _, name := range nodes {
		n := byName[name]
		if n == nil {
			continue
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": n.ResourceVersion,
			"annotations":     map[string]any{nodeconfig.DriftRepairAnnotation: nil},
		}})
		if err != nil {
			return err
		}
		if _, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			return fmt.Errorf("withdraw the drift repair request of node %s for pool %s: %w", name, pool.Name, err)
		}
		c.log.Info("withdrew the node's drift repair request: the pool no longer restores drift",
			zap.String("pool", pool.Name), zap.String("node", name))
	}
	return nil
}
