// SPDX-License-Identifier: Apache-2.0

// The write: one strategic-merge patch of the Node's status, made only when the Node does not show the
// node's desired status already.

package nodestatus

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// outcome is what write did with a node's latest report, when nothing failed. Report and the queue's loop
// each decide what an outcome means for them: an acknowledgement, a retry, a dropped report.
type outcome int

const (
	// written: the status was patched onto the Node. (The zero outcome is none: what a failed write
	// returns beside its error.)
	written outcome = iota + 1
	// unchanged: the Node already showed it.
	unchanged
	// held: a restart in progress, queued again for when RestartingDelay has passed, unless its outcome is
	// reported first.
	held
	// notCached: the Node exists, but this replica's Node cache has not seen it (or this object of it) yet;
	// the report is kept.
	notCached
	// noReport: the node has no report here (none received, or dropped as its Node is gone).
	noReport
	// nodeGone: the Node does not exist; its report was dropped (ErrNodeGone).
	nodeGone
	// otherNode: the report is about a deleted Node object of the name; it was dropped (ErrOtherNode).
	otherNode
)

var outcomeNames = [...]string{"none", "written", "unchanged", "held", "not cached", "no report", "node gone",
	"other node"}

func (o outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// lastWrite is what this replica last patched onto a node's Node: the cached Node's resourceVersion the
// patch was made over, and a digest of what it wrote. While the cache still shows that resourceVersion it
// has not seen the patch, and is no judge of whether the status is on the Node: the digest is.
type lastWrite struct {
	over   string
	digest uint64
}

// write patches the node's status unless the Node already shows it. An error is a failure to retry (the
// cache, the patch, the apiserver's answer on a gone Node); everything else is an outcome.
func (w *Writer) write(ctx context.Context, name string) (outcome, error) {
	l := w.lock(name)
	l.Lock()
	defer l.Unlock()
	d, ok := w.desired(name)
	if !ok {
		return noReport, nil
	}
	status, uid, seq := d.status, d.nodeUID, d.seq
	node, out, err := w.target(ctx, name, uid)
	if node == nil {
		return out, err
	}
	if d.hold > 0 {
		w.queue.AddAfter(name, d.hold)
		w.metrics.write("held")
		return held, nil
	}
	annotation, err := json.Marshal(status)
	if err != nil {
		return 0, fmt.Errorf("encode status of node %s: %w", name, err)
	}
	cond := Condition(status, d.message)
	var extra []corev1.NodeCondition
	if d.preview != nil {
		extra = append(extra, *d.preview)
	}
	drift, drifted := driftToWrite(node, d.drift)
	if drift != nil {
		extra = append(extra, *drift)
	}
	digest := writeDigest(string(annotation), cond, extra)
	if w.shown(name, node, string(annotation), status, cond, extra, digest) {
		w.metrics.write("unchanged")
		w.paid(name, seq)
		return unchanged, nil
	}
	patch, err := statusPatch(node, string(annotation), status, cond, extra, uid, w.clock.Now())
	if err != nil {
		return 0, err
	}
	start := w.clock.Now()
	if err := w.patchStatus(ctx, name, patch); err != nil {
		w.metrics.write("error")
		if uid != "" && (apierrors.IsConflict(err) || apierrors.IsInvalid(err)) {
			// Possibly the UID precondition: whether the report's object is still there decides.
			if out, derr := w.dropIfGone(ctx, name, uid); derr != nil || out != notCached {
				return out, derr
			}
		}
		return 0, fmt.Errorf("patch status of node %s: %w", name, err)
	}
	w.metrics.write("written")
	w.mu.Lock()
	w.stateLocked(name).written = &lastWrite{over: node.ResourceVersion, digest: digest}
	w.mu.Unlock()
	w.paid(name, seq)
	fields := []zap.Field{zap.String("node", name), zap.String("status", string(annotation)),
		zap.String("configOK", string(cond.Status)), zap.Duration("took", w.clock.Since(start))}
	if p := d.preview; p != nil {
		fields = append(fields, zap.String("configPreview", string(p.Status)),
			zap.String("previewReason", p.Reason), zap.String("previewMessage", p.Message))
	}
	if drift != nil {
		fields = append(fields, zap.String("configDrift", string(drift.Status)), zap.String("driftReason", drift.Reason))
	}
	w.log.Info("node status written", fields...)
	if drifted {
		w.recordDrift(ctx, name, *drift)
	}
	return written, nil
}

// target is the cached Node a report about object uid ("" if the sidecar did not say) is written onto; nil
// with the outcome when there is none: gone, or another object under the name.
func (w *Writer) target(ctx context.Context, name, uid string) (*corev1.Node, outcome, error) {
	node, err := w.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		// Before the hold: a deleted Node's report goes now, not after the delay, when a Node registered
		// again under the name could be there to take it.
		out, err := w.dropIfGone(ctx, name, uid)
		return nil, out, err
	}
	if err != nil {
		return nil, 0, fmt.Errorf("get node %s from cache: %w", name, err)
	}
	if uid != "" && string(node.UID) != uid {
		// The cached Node is another object than the report's: the report is about a deleted one, or the
		// cache has not seen the new one yet.
		out, err := w.dropIfGone(ctx, name, uid)
		return nil, out, err
	}
	return node, 0, nil
}

// shown says whether the Node already shows the status: in the cache, or, while the cache predates this
// replica's last patch of it, as that patch (digest) wrote it — a report that follows a write closely (or a
// queued write that follows a report) would otherwise patch the same status again.
func (w *Writer) shown(name string, node *corev1.Node, annotation string, status *corev1.NodeConfigStatus,
	cond corev1.NodeCondition, extra []corev1.NodeCondition, digest uint64) bool {
	w.mu.Lock()
	var last lastWrite
	wrote := false
	if s := w.state[name]; s != nil && s.written != nil {
		last, wrote = *s.written, true
	}
	w.mu.Unlock()
	if wrote && last.over == node.ResourceVersion {
		return last.digest == digest
	}
	return upToDate(node, annotation, status, cond, extra)
}

// statusPatch is the strategic merge patch of node's status: the annotation, status.config where the
// apiserver keeps it, the ConfigOK condition and the extra ones (ConfigPreview, ConfigDrift), each one's
// transition time kept while its status stays; with the UID precondition when the report names its
// object. Conditions merge by type: a patch without ConfigPreview leaves the Node's as it is.
func statusPatch(node *corev1.Node, annotation string, status *corev1.NodeConfigStatus, cond corev1.NodeCondition,
	extra []corev1.NodeCondition, uid string, now time.Time) ([]byte, error) {
	conds := []corev1.NodeCondition{stamped(node, cond, now)}
	for _, c := range extra {
		conds = append(conds, stamped(node, c, now))
	}
	meta := map[string]any{"annotations": map[string]string{nodeconfig.StatusAnnotation: annotation}}
	if uid != "" {
		// A precondition: the apiserver refuses the patch if the Node under the name is another object by now
		// (this replica's cache lagging a deletion and re-registration), rather than write this object's
		// status onto it.
		meta["uid"] = uid
	}
	return json.Marshal(map[string]any{
		"metadata": meta,
		"status": map[string]any{
			// Dropped by apiservers ≥ 1.24 unless the Node already has it (docs/design.md, "The apiserver
			// fact"); kept where allowed.
			"config":     configPatch(status),
			"conditions": conds,
		},
	})
}

// stamped is cond with its times: heartbeat now, transition now unless node's condition of its type has its
// status already.
func stamped(node *corev1.Node, cond corev1.NodeCondition, now time.Time) corev1.NodeCondition {
	cond.LastHeartbeatTime = metav1.NewTime(now)
	cond.LastTransitionTime = metav1.NewTime(now)
	for _, c := range node.Status.Conditions {
		if c.Type == cond.Type && c.Status == cond.Status {
			cond.LastTransitionTime = c.LastTransitionTime
		}
	}
	return cond
}

// patchStatus applies patch to node name's status. The typed client would decode the whole Node the
// apiserver answers with, which the writer never reads: at two writes per node per assignment, that decode
// was a large part of what each write allocated (docs/results.md).
// The REST client reads the answer (in full) without decoding it; an error answer is still decoded, so
// apierrors' predicates work on it.
func (w *Writer) patchStatus(ctx context.Context, name string, patch []byte) error {
	opts := metav1.PatchOptions{FieldManager: FieldManager}
	if rc, ok := w.client.CoreV1().RESTClient().(*rest.RESTClient); ok && rc != nil {
		return rc.Patch(types.StrategicMergePatchType).Resource("nodes").Name(name).SubResource("status").
			VersionedParams(&opts, scheme.ParameterCodec).Body(patch).Do(ctx).Error()
	}
	// client-go's fake clientsets have no REST client: unit tests go through the typed one.
	_, err := w.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, opts, "status")
	return err
}

// configPatch is status.config as a patch that leaves exactly status behind, whatever the Node held: every
// NodeConfigStatus field is omitempty, so a patch made of status alone could set fields but never remove one
// (an error would never clear, a reset would leave the old sources). Each absent field is therefore sent as
// null. The original kubelet got the nulls from a two-way patch against a Node it had just read; naming
// every field instead does not depend on what this replica's Node cache (possibly stale, possibly behind
// another replica's write) says the Node holds.
func configPatch(status *corev1.NodeConfigStatus) map[string]any {
	patch := map[string]any{
		"assigned":      sourcePatch(status.Assigned),
		"active":        sourcePatch(status.Active),
		"lastKnownGood": sourcePatch(status.LastKnownGood),
		"error":         nil,
	}
	if status.Error != "" {
		patch["error"] = status.Error
	}
	return patch
}

// sourcePatch is a NodeConfigSource as a patch that replaces the stored one: nil (JSON null, which removes
// the field) for none, else every field of its only kind, so nothing of a previous source survives.
func sourcePatch(s *corev1.NodeConfigSource) any {
	if s == nil || s.ConfigMap == nil {
		return nil
	}
	cm := s.ConfigMap
	return map[string]any{"configMap": map[string]any{
		"namespace":        cm.Namespace,
		"name":             cm.Name,
		"uid":              cm.UID,
		"resourceVersion":  cm.ResourceVersion,
		"kubeletConfigKey": cm.KubeletConfigKey,
	}}
}

// writeDigest sums what a write puts on the Node: the annotation (the whole status), the ConfigOK
// condition and the extra ones.
func writeDigest(annotation string, cond corev1.NodeCondition, extra []corev1.NodeCondition) uint64 {
	h := fnv.New64a()
	parts := []string{annotation, string(cond.Status), cond.Reason, cond.Message}
	for _, c := range extra {
		parts = append(parts, string(c.Type), string(c.Status), c.Reason, c.Message)
	}
	for _, part := range parts {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// upToDate reports whether the cached Node already carries the status and the extra conditions.
// status.config is compared only where the apiserver keeps it, or a v1.24+ apiserver would be patched
// forever.
func upToDate(node *corev1.Node, annotation string, status *corev1.NodeConfigStatus, cond corev1.NodeCondition,
	extra []corev1.NodeCondition) bool {
	if node.Annotations[nodeconfig.StatusAnnotation] != annotation {
		return false
	}
	if node.Status.Config != nil && !apiequality.Semantic.DeepEqual(node.Status.Config, status) {
		return false
	}
	missing := func(c corev1.NodeCondition) bool { return !carries(node, c) }
	return carries(node, cond) && !slices.ContainsFunc(extra, missing)
}

// carries says whether node's condition of cond's type has cond's status, reason and message.
func carries(node *corev1.Node, cond corev1.NodeCondition) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == cond.Type {
			return c.Status == cond.Status && c.Reason == cond.Reason && c.Message == cond.Message
		}
	}
	return false
}
