// SPDX-License-Identifier: Apache-2.0

// Package nodedrain cordons and drains a node for a kubelet config change that the kubelet refuses on the
// state its resource managers checkpointed (internal/disruption), marks it drained for exactly the
// ConfigMap version it then gets (nodeconfig.DrainedAnnotation: only then does its sidecar remove that
// state), and undoes all of it afterwards. The eviction itself is kubectl's (k8s.io/kubectl/pkg/drain):
// the Eviction API, so PodDisruptionBudgets hold; DaemonSet and mirror pods stay; terminating pods are
// waited for.
package nodedrain

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/drain"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// CordonedAnnotation marks a node that dkc cordoned, with who did ("kubectl-dkc", or "pool/NAME"): Release
// uncordons only such a node. A node someone else cordoned stays cordoned.
const CordonedAnnotation = "dkc.dev/cordoned"

// evictRetryDelay is the pause after an eviction the apiserver refuses (a PodDisruptionBudget).
const evictRetryDelay = 5 * time.Second

// Drainer drains nodes through one client.
type Drainer struct {
	Client kubernetes.Interface
	// FieldManager names dkc's writes to the Node.
	FieldManager string
	// Timeout bounds one Drain: evictions that a PodDisruptionBudget refuses are retried until then.
	Timeout time.Duration
	// Out and ErrOut receive what the drain does, pod by pod (kubectl drain's lines); nil discards them.
	Out, ErrOut io.Writer
}

// Cordon makes the node unschedulable and marks it as cordoned by by; a node someone else cordoned is left
// as it is, and ours is false (true when by's own mark is on it already: a drain taken over). Each patch
// carries the resourceVersion it read, so a node changed meanwhile is read again, never marked as ours
// when someone else cordoned it in between.
func (d *Drainer) Cordon(ctx context.Context, node, by string) (ours bool, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := d.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Spec.Unschedulable {
			ours = n.Annotations[CordonedAnnotation] == by
			return nil
		}
		ours = true
		return d.patch(ctx, node, map[string]any{
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion,
				"annotations": map[string]any{CordonedAnnotation: by}},
			"spec": map[string]any{"unschedulable": true},
		})
	})
	if err != nil {
		return false, fmt.Errorf("cordon node %s: %w", node, err)
	}
	return ours, nil
}

// Drain evicts the node's pods and waits until they are gone, or until Timeout. Pods no controller
// would recreate fail it (nothing brings them back), as kubectl drain without --force does; emptyDir data
// goes with its pod.
func (d *Drainer) Drain(ctx context.Context, node string) error {
	out, errOut := d.Out, d.ErrOut
	if out == nil {
		out = io.Discard
	}
	if errOut == nil {
		errOut = io.Discard
	}
	h := &drain.Helper{
		Ctx: ctx, Client: d.Client, GracePeriodSeconds: -1, IgnoreAllDaemonSets: true, DeleteEmptyDirData: true,
		Timeout: d.Timeout, Out: out, ErrOut: errOut,
		// kubectl drain's own pause between evictions a PodDisruptionBudget refuses; the library's zero
		// would ask the apiserver again at once, for as long as the budget holds.
		EvictErrorRetryDelay: evictRetryDelay,
	}
	if err := drain.RunNodeDrain(h, node); err != nil {
		return fmt.Errorf("drain node %s: %w", node, err)
	}
	return nil
}

// MarkDrained points the node at src (the annotation; spec.configSource too where the node has it) and
// marks it drained for exactly cm's version, in one patch: the node's sidecar never sees the one without
// the other. A nil src and cm are the node's local config.
func (d *Drainer) MarkDrained(ctx context.Context, n *corev1.Node, src *corev1.NodeConfigSource,
	cm *corev1.ConfigMap) error {
	var source any // null: the annotation removed, the local config
	what, mark := "its local config", nodeconfig.MarshalDrained("", "")
	if src != nil {
		raw, err := json.Marshal(src)
		if err != nil {
			return err
		}
		source, what = string(raw), cm.Namespace+"/"+cm.Name
		mark = nodeconfig.MarshalDrained(cm.UID, cm.ResourceVersion)
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		nodeconfig.SourceAnnotation: source, nodeconfig.DrainedAnnotation: mark,
	}}}
	if n.Spec.ConfigSource != nil {
		patch["spec"] = map[string]any{"configSource": src}
	}
	if err := d.patch(ctx, n.Name, patch); err != nil {
		return fmt.Errorf("assign node %s %s as drained: %w", n.Name, what, err)
	}
	return nil
}

// Mark marks the node drained for exactly the ConfigMap version uid/resourceVersion it is assigned
// already (a pool's snapshot: immutable, so its version is known before the node reports it).
func (d *Drainer) Mark(ctx context.Context, node string, uid types.UID, resourceVersion string) error {
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		nodeconfig.DrainedAnnotation: nodeconfig.MarshalDrained(uid, resourceVersion)}}}
	if err := d.patch(ctx, node, patch); err != nil {
		return fmt.Errorf("mark node %s drained: %w", node, err)
	}
	return nil
}

// Release undoes by's drain of the node: it removes the drained mark and, when by cordoned the node
// (CordonedAnnotation is by), the cordon. Another party's cordon stays, and so does its mark.
func (d *Drainer) Release(ctx context.Context, node, by string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := d.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cordoner, cordoned := n.Annotations[CordonedAnnotation]
		_, marked := n.Annotations[nodeconfig.DrainedAnnotation]
		mine := cordoned && cordoner == by
		if cordoned && !mine || !mine && !marked {
			return nil // another party's drain, or nothing of by's left
		}
		patch := map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion,
			"annotations": map[string]any{nodeconfig.DrainedAnnotation: nil}}}
		if mine {
			patch["metadata"].(map[string]any)["annotations"].(map[string]any)[CordonedAnnotation] = nil
			patch["spec"] = map[string]any{"unschedulable": false}
		}
		return d.patch(ctx, node, patch)
	})
	if err != nil {
		return fmt.Errorf("release node %s: %w", node, err)
	}
	return nil
}

func (d *Drainer) patch(ctx context.Context, node string, patch map[string]any) error {
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = d.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, raw,
		metav1.PatchOptions{FieldManager: d.FieldManager})
	return err
}
