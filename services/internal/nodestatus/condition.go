// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
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
