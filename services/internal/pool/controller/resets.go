// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/capacity"
	"github.com/dkc-dev/dkc/internal/disruption"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
	"github.com/dkc-dev/dkc/services/internal/pool/plan"
	"github.com/dkc-dev/dkc/services/internal/pool/revision"
)

// maxNamedNodes bounds the nodes a DrainRequired or CapacityRefused message names; the rest are counted.
const maxNamedNodes = 5

// capacityRecheck is how long a revision refused for its nodes' pods stays refused before the pods are
// listed again: the refusal lasts while the config does, and syncs come with every Node event.
const capacityRecheck = 30 * time.Second

// capacityVerdict is the last capacity check of a pool's new revision.
type capacityVerdict struct {
	revision string
	at       time.Time
	invalid  *plan.Invalid
}

// nodeChecks refuses a new revision for what it would do on the selected nodes, before any is assigned it:
//
//   - DrainRequired (unless the pool may drain): the kubelet would refuse to start with it on the state its
//     resource managers checkpointed under the config the node runs now (disruption.Resets: another CPU or
//     memory manager policy, or other reservations under a static one). Each node assigned such a
//     revision would only fail it and be rolled back, and the pool halt; ConfigInvalid says which nodes and
//     state files, and how to make the change by hand.
//   - CapacityRefused (unless the pool may drain): the kubelet, restarted with it, would no longer admit
//     pods running on the node (a lower maxPods, larger reservations or eviction thresholds:
//     capacity.Under, oldest pods first as the kubelet re-admits them; a critical pod that no longer fits
//     evicts others instead), or would not start at all (reservations over the node's capacity). The pods
//     would fail with OutOfpods, OutOfcpu, ... — which the workload gate would then count as the node's
//     failure, too late for the pods. A pool that may drain assigns: the node's sidecar, predicting the
//     same, waits for the drain the pool then makes.
//
// A node is judged when it runs one of the pool's own revisions (its status's active source is one of the
// pool's snapshots): both configs are then known, and compared as the kubelet of the node's minor
// runs them (its defaults applied, by the same helper as the kubelet check). The config of a node on
// its local config, or on a source the pool did not assign, is not known here: its kubelet decides, its
// sidecar rolls a failed start back, and the workload gate counts failed pods. A node's flags (which the
// helper does not see here) are not compared either; where a flag makes the node's allocatable other than
// its config gives, no pod is predicted (capacity.Capacity.Unpredicted).
func (c *Controller) nodeChecks(ctx context.Context, pool *v1alpha1.KubeletConfigPool, rev string, content []byte,
	selected []*corev1.Node) (*plan.Invalid, error) {
	if v, ok := c.capacityVerdict(pool.Name, rev); ok {
		return v, nil
	}
	ref := pool.Spec.ConfigMap
	versions := kubeletMinors(selected)
	var resets, unfit findings
	for _, n := range sortedByName(selected) {
		minor := checkapi.Minor(n.Status.NodeInfo.KubeletVersion)
		running, snapshot := runningRevision(pool, statusOf(n))
		if minor == "" || running == "" || running == rev {
			continue
		}
		version := versions[minor].version
		next, err := c.kubelets.outcome(ctx, ref, rev, content, minor, version)
		if err != nil {
			return nil, err
		}
		cm := c.cachedSnapshot(snapshot.Namespace + "/" + snapshot.Name)
		if next.fields == nil || cm == nil ||
			revision.Verify(cm, pool.Name, running, snapshot.KubeletConfigKey, pool.Status.RevisionSnapshots, true) != nil {
			// Not checked (logged), the snapshot gone, or not the one the pool made (its outcome would be kept
			// as the revision's): the node's kubelet decides.
			continue
		}
		was, err := c.kubelets.outcome(ctx, ref, running, []byte(cm.Data[snapshot.KubeletConfigKey]), minor, version)
		if err != nil {
			return nil, err
		}
		if was.fields == nil {
			continue
		}
		at := fmt.Sprintf("node %s (revision %s, kubelet %s)", n.Name, running, minor)
		if r := disruption.Resets(was.fields, next.fields); len(r) > 0 {
			if !pool.Spec.MayDrain() {
				items := make([]string, len(r))
				for i, x := range r {
					items[i] = x.String()
				}
				resets.add(at + ": " + strings.Join(items, ", "))
			}
			// A pool that may drain empties such a node before its kubelet restarts: its pods will not be
			// admitted again there.
			continue
		}
		if resets.nodes == 0 && !pool.Spec.MayDrain() && capacity.Changes(was.fields, next.fields) {
			// (Once a node needs a drain the pool may not make, the revision is refused for that: the other
			// nodes' pods need not be listed. A pool that may drain is not refused: each node's sidecar makes
			// the same prediction before its restart and waits for the drain the pool then makes.)
			pods, err := c.nodePods(ctx, n.Name)
			if err != nil {
				return nil, err
			}
			got, err := capacity.Under(n, was.fields, next.fields, pods)
			if err != nil {
				return nil, err
			}
			if f := refusedFor(got); f != "" {
				unfit.add(at + ": " + f)
			}
		}
	}
	var invalid *plan.Invalid
	switch {
	case resets.nodes > 0:
		// Each sync while the revision stays refused decides the same; the condition's change makes the Event.
		c.log.Debug("refused a pool's revision: its nodes' kubelets would refuse it on their checkpointed state",
			zap.String("pool", pool.Name), zap.String("revision", rev), zap.Int("nodes", resets.nodes))
		invalid = &plan.Invalid{Reason: v1alpha1.ReasonDrainRequired,
			Message: fmt.Sprintf("configmap %s/%s (revision %s) key %q: the kubelet refuses to start with it on the "+
				"state its resource managers checkpointed under the revision the node runs, until the node is drained and "+
				"the state file removed; a pool does not drain nodes, so nothing is assigned while a selected node runs a "+
				"revision "+
				"it conflicts with: %s. To make the change, take the nodes out of the pool and run kubectl dkc assign "+
				"NODE... --configmap %s/%s --key %s --drain (it drains one node at a time, its sidecar removes the state "+
				"file, and it uncordons the node once it runs the config)",
				ref.Namespace, ref.Name, rev, ref.KubeletConfigKey, resets.String(), ref.Namespace, ref.Name,
				ref.KubeletConfigKey)}
	case unfit.nodes > 0:
		c.log.Debug("refused a pool's revision: its nodes' kubelets would no longer admit their pods",
			zap.String("pool", pool.Name), zap.String("revision", rev), zap.Int("nodes", unfit.nodes))
		invalid = &plan.Invalid{Reason: v1alpha1.ReasonCapacityRefused,
			Message: fmt.Sprintf("configmap %s/%s (revision %s) key %q: a kubelet restarted with it re-admits the pods "+
				"running on the node against less room, and would fail some (OutOfpods, OutOfcpu, ...); nothing is "+
				"assigned while a selected node's running pods do not fit: %s. Move pods off those nodes (kubectl drain), or "+
				"change the config; kubectl dkc rollout --dry-run shows each node's allocatable and pods",
				ref.Namespace, ref.Name, rev, ref.KubeletConfigKey, unfit.String())}
	}
	if invalid != nil && invalid.Reason == v1alpha1.ReasonCapacityRefused {
		// Kept a while: listing the nodes' pods at every sync would cost the apiserver while the config
		// stays refused. (The resets' verdict is cheap to make again: the helper's outcomes are cached.)
		c.keepCapacityVerdict(pool.Name, rev, invalid)
	}
	return invalid, nil
}

// refusedFor says why the kubelet would fail pods on a node under a config, "" if it would not.
func refusedFor(got capacity.Capacity) string {
	if got.NotStarting != "" {
		return got.NotStarting
	}
	var pods []string
	for _, u := range got.Unfit {
		// A critical pod that no longer fits is admitted by evicting others, past their budgets too.
		pods = append(pods, u.Pod+" ("+u.Reason+")")
	}
	if len(pods) > maxNamedPods {
		pods = append(pods[:maxNamedPods], fmt.Sprintf("and %d more", len(pods)-maxNamedPods))
	}
	return strings.Join(pods, ", ")
}

// maxNamedPods bounds the pods a CapacityRefused message names per node.
const maxNamedPods = 10

// capacityVerdict is the pool's last capacity verdict on rev while it is fresh.
func (c *Controller) capacityVerdict(pool, rev string) (*plan.Invalid, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.capacity[pool]
	if !ok || v.revision != rev || c.clock.Since(v.at) >= capacityRecheck {
		return nil, false
	}
	return v.invalid, true
}

func (c *Controller) keepCapacityVerdict(pool, rev string, invalid *plan.Invalid) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capacity[pool] = capacityVerdict{revision: rev, at: c.clock.Now(), invalid: invalid}
}

// findings are the nodes a refusal names: the first maxNamedNodes, and how many more.
type findings struct {
	named []string
	nodes int
}

func (f *findings) add(s string) {
	f.nodes++
	if f.nodes <= maxNamedNodes {
		f.named = append(f.named, s)
	}
}

func (f findings) String() string {
	s := strings.Join(f.named, "; ")
	if f.nodes > maxNamedNodes {
		s += fmt.Sprintf("; and %d more nodes", f.nodes-maxNamedNodes)
	}
	return s
}

// runningRevision is the pool's revision a node's kubelet runs, by its status's active source, and that
// revision's snapshot; "" when the node runs something else or nothing reported yet.
func runningRevision(pool *v1alpha1.KubeletConfigPool, st corev1.NodeConfigStatus) (string, v1alpha1.RevisionSnapshot) {
	if st.Active == nil || st.Active.ConfigMap == nil || pool.Status.RevisionSnapshots == nil {
		return "", v1alpha1.RevisionSnapshot{}
	}
	a := st.Active.ConfigMap
	for _, s := range pool.Status.RevisionSnapshots.Items {
		if s.Namespace == a.Namespace && s.Name == a.Name && s.KubeletConfigKey == a.KubeletConfigKey {
			return s.Revision, s
		}
	}
	return "", v1alpha1.RevisionSnapshot{}
}

// sortedByName is nodes in name order, for messages that do not change from sync to sync.
func sortedByName(nodes []*corev1.Node) []*corev1.Node {
	out := slices.Clone(nodes)
	slices.SortFunc(out, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}
