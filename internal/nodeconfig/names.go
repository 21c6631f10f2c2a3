// SPDX-License-Identifier: Apache-2.0

package nodeconfig

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// SourceAnnotation holds the JSON of a core/v1 NodeConfigSource on apiservers that drop
// spec.configSource (every apiserver since 1.24). spec.configSource wins where the apiserver keeps it.
const SourceAnnotation = "dkc.dev/config-source"

// StatusAnnotation holds the JSON of the node's core/v1 NodeConfigStatus, written by dkc-server, on
// apiservers that drop status.config.
const StatusAnnotation = "dkc.dev/config-status"

// ConditionType is the Node condition dkc maintains: True exactly when the status has no error.
const ConditionType corev1.NodeConditionType = "ConfigOK"

// Reasons of the ConfigOK condition.
const (
	ReasonUsingCurrent       = "UsingCurrent"
	ReasonUsingLastKnownGood = "UsingLastKnownGood"
	ReasonSyncFailed         = "SyncFailed"
	ReasonConfigFailed       = "ConfigFailed"
)

// PreviewConditionType is the Node condition that answers a pool's preview of a revision (the pool's
// status.preview): what the node's sidecar found the revision would do there, before any node is assigned
// it. Its message starts with v1alpha1.PreviewPrefix (the pool, revision and request time it answers).
// Written by dkc-server, like ConfigOK, from the sidecar's report.
const PreviewConditionType corev1.NodeConditionType = "ConfigPreview"

// Reasons of the ConfigPreview condition: True NoPodsAffected; False PodsAffected (the restarted kubelet
// would stop or evict running pods), DrainRequired (it would refuse the state its resource managers
// checkpointed), ConfigRefused (the node's kubelet refuses the config, its flags and drop-ins applied);
// Unknown NotPredicted (the sidecar could not tell, and says why).
const (
	PreviewNoPodsAffected = "NoPodsAffected"
	PreviewPodsAffected   = "PodsAffected"
	PreviewDrainRequired  = "DrainRequired"
	PreviewConfigRefused  = "ConfigRefused"
	PreviewNotPredicted   = "NotPredicted"
)

// DriftConditionType is the Node condition that says whether the kubelet runs what it should: True when
// its sidecar's last check found the running config (/configz) or dkc's wiring of the kubelet differing from
// the node's active config, its reason the cause; False (DriftNone) once a check finds no difference. Written
// by dkc-server, like ConfigOK, from the sidecar's report; absent on nodes whose sidecar never reported one.
const DriftConditionType corev1.NodeConditionType = "ConfigDrift"

// Reasons of the ConfigDrift condition: the causes a sidecar names (proto Drift.cause), and DriftNone.
const (
	DriftWiringRemoved       = "WiringRemoved"
	DriftWiringReplaced      = "WiringReplaced"
	DriftFlagOverride        = "FlagOverride"
	DriftConfigDirDropIn     = "ConfigDirDropIn"
	DriftKubeletMinorChanged = "KubeletMinorChanged"
	DriftUnknown             = "Unknown"
	DriftNone                = "NoDrift"
)

// DriftCauses are the causes a ConfigDrift condition may name; a sidecar's other answer is written as
// DriftUnknown.
var DriftCauses = []string{DriftWiringRemoved, DriftWiringReplaced, DriftFlagOverride, DriftConfigDirDropIn,
	DriftKubeletMinorChanged, DriftUnknown}

// DriftEventReason is the reason of the Event dkc-server records on a Node when its ConfigDrift turns True.
const DriftEventReason = "KubeletConfigDrifted"

// EventReason is the original kubelet's reason for a restart to change config.
const EventReason = "KubeletConfigChanged"

// Event messages of the original kubelet (pkg/kubelet/kubeletconfig/configsync.go).
const (
	LocalEventMessage     = "Kubelet restarting to use local config"
	RemoteEventMessageFmt = "Kubelet restarting to use %s, UID: %s, ResourceVersion: %s, KubeletConfigKey: %s"
)

// EventMessage is the original's message for a restart to target (nil = local config).
func EventMessage(target *corev1.NodeConfigSource) string {
	if target == nil || target.ConfigMap == nil {
		return LocalEventMessage
	}
	cm := target.ConfigMap
	return fmt.Sprintf(RemoteEventMessageFmt, APIPath(cm), cm.UID, cm.ResourceVersion, cm.KubeletConfigKey)
}

// APIPath is the original's name for a ConfigMap source in events and metrics.
func APIPath(cm *corev1.ConfigMapNodeConfigSource) string {
	return "/api/v1/namespaces/" + cm.Namespace + "/configmaps/" + cm.Name
}
