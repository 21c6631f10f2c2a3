// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// Condition is the ConfigOK condition for a status, worded like the 1.8 KubeletConfigOk messages:
// "using current (local)", "using current (UID: …, ResourceVersion: …)", "using last-known-good (…)".
// It is True exactly when status.Error is empty. Timestamps are left to the writer.
func Condition(status *corev1.NodeConfigStatus, detail string) corev1.NodeCondition {
	using := "using current"
	reason := nodeconfig.ReasonUsingCurrent
	active := status.Active
	if !apiequality.Semantic.DeepEqual(status.Active, status.Assigned) {
		// Assigned is not what runs: either a rollback to last-known-good, or an assignment not applied yet.
		if apiequality.Semantic.DeepEqual(status.Active, status.LastKnownGood) && status.Error != "" {
			using, reason = "using last-known-good", nodeconfig.ReasonUsingLastKnownGood
		}
	}
	msg := fmt.Sprintf("%s (%s)", using, describe(active))
	cond := corev1.NodeCondition{Type: nodeconfig.ConditionType, Status: corev1.ConditionTrue, Reason: reason,
		Message: msg}
	if status.Error != "" {
		cond.Status = corev1.ConditionFalse
		if reason == nodeconfig.ReasonUsingCurrent {
			cond.Reason = nodeconfig.ReasonSyncFailed
		} else {
			cond.Reason = nodeconfig.ReasonConfigFailed
		}
		cond.Message = status.Error + "; " + msg
		if detail != "" {
			cond.Message += ": " + detail
		}
	}
	return cond
}

func describe(s *corev1.NodeConfigSource) string {
	if s == nil || s.ConfigMap == nil {
		return "local"
	}
	cm := s.ConfigMap
	return fmt.Sprintf("%s/%s, UID: %s, ResourceVersion: %s, KubeletConfigKey: %s", cm.Namespace, cm.Name, cm.UID,
		cm.ResourceVersion, cm.KubeletConfigKey)
}

// PreviewCondition is the ConfigPreview condition answering a pool's preview with the sidecar's result:
// True when nothing is affected, False when pods are, a drain is required or the kubelet refuses the
// config, Unknown when nothing could be predicted (and for a verdict this version does not know, whose
// reason is then NotPredicted). Its message names what it answers (v1alpha1.PreviewPrefix: the pool counts
// only answers to its own request), then the sidecar's words, bounded as a status detail is.
// Timestamps are left to the writer.
func PreviewCondition(res *dkcv1.PreviewResult) corev1.NodeCondition {
	cond := corev1.NodeCondition{Type: nodeconfig.PreviewConditionType, Reason: res.GetVerdict()}
	switch res.GetVerdict() {
	case nodeconfig.PreviewNoPodsAffected:
		cond.Status = corev1.ConditionTrue
	case nodeconfig.PreviewPodsAffected, nodeconfig.PreviewDrainRequired, nodeconfig.PreviewConfigRefused:
		cond.Status = corev1.ConditionFalse
	default:
		cond.Status, cond.Reason = corev1.ConditionUnknown, nodeconfig.PreviewNotPredicted
	}
	cond.Message = v1alpha1.PreviewPrefix(res.GetPool(), res.GetRevision(), res.GetRequestTime().AsTime()) +
		nodeconfig.TruncateDetail(res.GetMessage())
	return cond
}

// answers says whether res answers exactly preview p: its pool, revision and request time.
func answers(res *dkcv1.PreviewResult, p *dkcv1.Preview) bool {
	return res != nil && p != nil && res.GetPool() == p.GetPool() && res.GetRevision() == p.GetRevision() &&
		res.GetRequestTime().AsTime().Equal(p.GetRequestTime().AsTime())
}

// DriftCondition is the ConfigDrift condition of a sidecar's drift finding: True with the cause as its
// reason (DriftUnknown for a cause this version does not know), the differing fields and the sidecar's
// words, bounded as a status detail; for a finding without a cause (the check found none), False
// DriftNone. Timestamps are left to the writer.
func DriftCondition(d *dkcv1.Drift) corev1.NodeCondition {
	if d.GetCause() == "" {
		return corev1.NodeCondition{Type: nodeconfig.DriftConditionType, Status: corev1.ConditionFalse,
			Reason: nodeconfig.DriftNone, Message: "the kubelet runs the node's active config, with dkc's wiring in place"}
	}
	reason := d.GetCause()
	if !slices.Contains(nodeconfig.DriftCauses, reason) {
		reason = nodeconfig.DriftUnknown
	}
	msg := d.GetMessage()
	if f := d.GetFields(); len(f) > 0 {
		msg = "fields " + strings.Join(f, ", ") + ": " + msg
	}
	return corev1.NodeCondition{Type: nodeconfig.DriftConditionType, Status: corev1.ConditionTrue, Reason: reason,
		Message: nodeconfig.TruncateDetail(msg)}
}

// driftToWrite is the ConfigDrift condition a write puts on node for a report's drift finding d, nil when
// none: a drift is written; "none found" (d without a cause) only clears a condition the Node carries, so
// that nodes that never drifted carry none; no finding at all (d nil: the sidecar has not checked since it
// started, or is older) leaves the Node's as it is. drifted says the Node turns to True with it.
func driftToWrite(node *corev1.Node, d *dkcv1.Drift) (cond *corev1.NodeCondition, drifted bool) {
	if d == nil {
		return nil, false
	}
	var had *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == nodeconfig.DriftConditionType {
			had = &node.Status.Conditions[i]
		}
	}
	if d.GetCause() == "" && had == nil {
		return nil, false
	}
	c := DriftCondition(d)
	turned := had == nil || had.Status != corev1.ConditionTrue || had.Reason != c.Reason
	return &c, c.Status == corev1.ConditionTrue && turned
}
