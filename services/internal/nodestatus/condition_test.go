// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

func cm(rv string) *corev1.NodeConfigSource {
	return &corev1.NodeConfigSource{ConfigMap: &corev1.ConfigMapNodeConfigSource{Namespace: "kube-system", Name: "c", UID: "u1", ResourceVersion: rv, KubeletConfigKey: "kubelet"}}
}

func TestCondition(t *testing.T) {
	for _, tc := range []struct {
		name        string
		status      corev1.NodeConfigStatus
		detail      string
		wantStatus  corev1.ConditionStatus
		wantReason  string
		wantMessage string
	}{
		{"local", corev1.NodeConfigStatus{}, "", corev1.ConditionTrue, nodeconfig.ReasonUsingCurrent, "using current (local)"},
		{"current", corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}, "", corev1.ConditionTrue, nodeconfig.ReasonUsingCurrent,
			"using current (kube-system/c, UID: u1, ResourceVersion: 1, KubeletConfigKey: kubelet)"},
		{"rolled back to lkg", corev1.NodeConfigStatus{Assigned: cm("2"), Active: cm("1"), LastKnownGood: cm("1"),
			Error: "failed to validate config, see Kubelet log for details"}, "eventRecordQPS must not be negative",
			corev1.ConditionFalse, nodeconfig.ReasonConfigFailed,
			"failed to validate config, see Kubelet log for details; using last-known-good (kube-system/c, UID: u1, ResourceVersion: 1, KubeletConfigKey: kubelet): eventRecordQPS must not be negative"},
		{"rolled back to local", corev1.NodeConfigStatus{Assigned: cm("2"), Error: "failed to load config, see Kubelet log for details"}, "",
			corev1.ConditionFalse, nodeconfig.ReasonConfigFailed, "failed to load config, see Kubelet log for details; using last-known-good (local)"},
		{"sync failed", corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1"), Error: "failed to sync: failed to download config, see Kubelet log for details"}, "",
			corev1.ConditionFalse, nodeconfig.ReasonSyncFailed,
			"failed to sync: failed to download config, see Kubelet log for details; using current (kube-system/c, UID: u1, ResourceVersion: 1, KubeletConfigKey: kubelet)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Condition(&tc.status, tc.detail)
			if c.Type != nodeconfig.ConditionType || c.Status != tc.wantStatus || c.Reason != tc.wantReason || c.Message != tc.wantMessage {
				t.Errorf("Condition = %s/%s/%s %q\nwant %s/%s %q", c.Type, c.Status, c.Reason, c.Message, tc.wantStatus, tc.wantReason, tc.wantMessage)
			}
		})
	}
}

func TestEventMessage(t *testing.T) {
	if got := nodeconfig.EventMessage(nil); got != "Kubelet restarting to use local config" {
		t.Errorf("local: %q", got)
	}
	want := "Kubelet restarting to use /api/v1/namespaces/kube-system/configmaps/c, UID: u1, ResourceVersion: 7, KubeletConfigKey: kubelet"
	if got := nodeconfig.EventMessage(cm("7")); got != want {
		t.Errorf("remote: %q, want %q", got, want)
	}
}
