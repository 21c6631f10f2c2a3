// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dkc-dev/dkc/internal/disruption"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodedrain"
)

// cordonedBy is what kubectl dkc writes into nodedrain.CordonedAnnotation.
const cordonedBy = "kubectl-dkc"

// drainOptions are assign --drain's.
type drainOptions struct {
	drainTimeout time.Duration // per node: evictions a PodDisruptionBudget refuses are retried until then
	applyTimeout time.Duration // per node: from the assignment until the node reports the config active
}

// assignDraining assigns the nodes src one after the other. A node whose kubelet would refuse the change on
// its resource managers' state (resets), or would reject or evict running pods (evicts, also when that could
// not be told), is cordoned, drained, assigned and marked drained for exactly the ConfigMap's version — so
// that its sidecar removes that state, with the kubelet stopped, or restarts the kubelet on the emptied
// node — and, once the node reports the config active or failed, its mark is removed and it is uncordoned,
// unless someone else had cordoned it. The others are assigned as assign always does. It stops at the first
// node that fails.
func (o *Options) assignDraining(ctx context.Context, nodes []corev1.Node, src *corev1.NodeConfigSource,
	resets map[string][]disruption.Reset, evicts map[string]evictions, opts drainOptions) error {
	d := &nodedrain.Drainer{Client: o.client, FieldManager: "kubectl-dkc", Timeout: opts.drainTimeout,
		Out: o.io.Out, ErrOut: o.io.ErrOut}
	ref := src.ConfigMap
	for i := range nodes {
		n := &nodes[i]
		found, checked := resets[n.Name]
		if checked && found == nil {
			// Not checked: drained all the same, as asked, rather than left to its sidecar's refusal.
			fmt.Fprintf(o.io.Out, "node/%s: its state could not be checked; draining it\n", n.Name)
		} else if e := evicts[n.Name]; len(found) == 0 && len(e.lines)+len(e.unread) == 0 {
			where, err := o.setSource(ctx, n, src)
			if err != nil {
				return fmt.Errorf("assign node %s: %w", n.Name, err)
			}
			fmt.Fprintf(o.io.Out, "node/%s assigned %s/%s (key %s) via %s; no drain needed\n", n.Name, ref.Namespace,
				ref.Name, ref.KubeletConfigKey, where)
			continue
		}
		for _, r := range found {
			fmt.Fprintf(o.io.Out, "node/%s needs a drain: %s\n", n.Name, r)
		}
		for _, why := range append(evicts[n.Name].lines, evicts[n.Name].unread...) {
			fmt.Fprintf(o.io.Out, "node/%s needs a drain: %s\n", n.Name, why)
		}
		if err := o.drainAndAssign(ctx, d, n, src, opts); err != nil {
			return err
		}
	}
	return nil
}

// drainAndAssign is one node's cordon, drain, assignment, wait and release. The release runs whatever
// happened after the cordon: a node is never left cordoned by dkc, nor marked drained, after it returns
// (but when the release itself fails: the error says so).
func (o *Options) drainAndAssign(ctx context.Context, d *nodedrain.Drainer, n *corev1.Node,
	src *corev1.NodeConfigSource, opts drainOptions) (err error) {
	ours, err := d.Cordon(ctx, n.Name, cordonedBy)
	if err != nil {
		return err
	}
	if ours {
		fmt.Fprintf(o.io.Out, "node/%s cordoned\n", n.Name)
	} else {
		fmt.Fprintf(o.io.Out, "node/%s was cordoned already; it stays cordoned\n", n.Name)
	}
	defer func() {
		// Its own context: a command interrupted (Ctrl-C) must still take its marks back.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := d.Release(rctx, n.Name, cordonedBy); rerr != nil {
			err = errors.Join(err, rerr)
			return
		}
		if ours {
			fmt.Fprintf(o.io.Out, "node/%s uncordoned\n", n.Name)
		}
	}()
	if err := d.Drain(ctx, n.Name); err != nil {
		return err
	}
	fmt.Fprintf(o.io.Out, "node/%s drained\n", n.Name)
	var cm *corev1.ConfigMap // nil: the local config
	if src != nil && src.ConfigMap != nil {
		ref := src.ConfigMap
		// The version the node gets is the one the mark names: read it after the drain, not before.
		if cm, err = o.client.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("configmap %s/%s: %w", ref.Namespace, ref.Name, err)
		}
	}
	fresh, err := o.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if err := d.MarkDrained(ctx, fresh, src, cm); err != nil {
		return err
	}
	if cm == nil {
		fmt.Fprintf(o.io.Out, "node/%s reset to its local config as drained\n", n.Name)
	} else {
		fmt.Fprintf(o.io.Out, "node/%s assigned %s/%s (key %s) as drained for resourceVersion %s\n", n.Name,
			cm.Namespace, cm.Name, src.ConfigMap.KubeletConfigKey, cm.ResourceVersion)
	}
	return o.waitApplied(ctx, n.Name, cm, opts.applyTimeout)
}

// waitApplied waits until the node reports cm's version (nil: its local config) active (nil) or failed
// (an error naming the node's status): the node's sidecar restarts its kubelet and proves the config, or
// rolls back. A refusal for want of a drain is not final: it is what the node said before it saw the mark.
func (o *Options) waitApplied(ctx context.Context, node string, cm *corev1.ConfigMap, timeout time.Duration) error {
	what := "its local config"
	if cm != nil {
		what = cm.Namespace + "/" + cm.Name
	}
	var last NodeStatus
	var failed error
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		n, err := o.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // the apiserver away for a moment: ask again until the timeout
		}
		last = StatusOf(n)
		st := last.Status
		if st == nil {
			return false, nil
		}
		if isVersion(st.Active, cm) && st.Error == "" {
			return true, nil
		}
		if isVersion(st.Assigned, cm) && st.Error != "" && st.Error != string(nodeconfig.DrainRequiredError) {
			failed = fmt.Errorf("node %s failed %s: %s (%s)", node, what, st.Error, last.Message)
			return true, nil
		}
		return false, nil
	})
	switch {
	case failed != nil:
		return failed
	case err != nil:
		return fmt.Errorf("node %s did not report %s active within %v (last status: assigned %s, active %s, "+
			"error %q): %w", node, what, timeout, describe(statusSource(last, true)),
			describe(statusSource(last, false)), errorOf(last), err)
	}
	fmt.Fprintf(o.io.Out, "node/%s runs %s\n", node, what)
	return nil
}

// isVersion says whether src names exactly cm's version (nil cm: the local config, a nil or empty src).
func isVersion(src *corev1.NodeConfigSource, cm *corev1.ConfigMap) bool {
	if src == nil || src.ConfigMap == nil {
		return cm == nil
	}
	return cm != nil && src.ConfigMap.UID == cm.UID && src.ConfigMap.ResourceVersion == cm.ResourceVersion
}

func statusSource(s NodeStatus, assigned bool) *corev1.NodeConfigSource {
	switch {
	case s.Status == nil:
		return nil
	case assigned:
		return s.Status.Assigned
	default:
		return s.Status.Active
	}
}

func errorOf(s NodeStatus) string {
	if s.Status == nil {
		return ""
	}
	return s.Status.Error
}
