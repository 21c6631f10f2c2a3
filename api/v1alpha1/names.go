// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Condition types of a pool.
const (
	// ConditionUpdated is True when every selected node is updated to the current revision.
	ConditionUpdated = "Updated"
	// ConditionUpdating is True while the pool has nodes to roll out and nothing stops it.
	ConditionUpdating = "Updating"
	// ConditionDegraded is True when a node failed the current revision or another pool selects a node too.
	ConditionDegraded = "Degraded"
	// ConditionHalted is True when failures reached maxFailures: the pool assigns nothing more.
	ConditionHalted = "Halted"
	// ConditionPaused is True when spec.paused is.
	ConditionPaused = "Paused"
	// ConditionConfigInvalid is True when the pool's config cannot be rolled out at all (the ConfigMap or
	// its key is missing, its namespace is not one dkc-server reads, the kubelet's own validation refuses
	// it, an object the pool did not create holds its snapshot's name, or the nodes' kubelets would refuse
	// it on their checkpointed state until drained): caught before any node is touched.
	ConditionConfigInvalid = "ConfigInvalid"
	// ConditionPreviewed says what the selected nodes' sidecars found when the pool last previewed a revision
	// (status.preview): True when no node found anything, False naming the nodes that did, Unknown while the
	// pool waits for answers. Absent when the pool never previewed one.
	ConditionPreviewed = "Previewed"
	// ConditionDrifted is True when nodes that were updated no longer run the revision as it was proven
	// (status.nodes.drifted; each Node's ConfigDrift condition says why), False when none does.
	ConditionDrifted = "Drifted"
)

// Condition reasons.
const (
	// Drifted
	ReasonNodesDrifted = "NodesDrifted"
	ReasonNoDrift      = "NoDrift"

	// Updated
	ReasonAllNodesUpdated = "AllNodesUpdated"
	ReasonNodesNotUpdated = "NodesNotUpdated"
	// The selector matches no node: nothing is updated, and "all of none" would read as done.
	ReasonNoNodesSelected = "NoNodesSelected"

	// Updating (True)
	ReasonRollingOut            = "RollingOut"
	ReasonWaitingBetweenBatches = "WaitingBetweenBatches"
	ReasonWaitingForAvailable   = "WaitingForAvailableNodes"
	// Nodes in progress run the revision and wait for pods that ran there before their kubelet restarted
	// to be Ready again (spec.disruption.podReadinessTimeout).
	ReasonWaitingForPods = "WaitingForPods"
	// No pending node can restart now without taking a PodDisruptionBudget below what it allows (a restart
	// that costs its pods their readiness: 1.34 kubelets).
	ReasonWaitingForDisruptionBudget = "WaitingForDisruptionBudget"
	// Outside every maintenance window: nothing new is assigned until the next opens.
	ReasonWaitingForMaintenanceWindow = "WaitingForMaintenanceWindow"
	// The pool waits for the selected nodes' sidecars to preview its new revision (status.preview) before
	// assigning it to any node.
	ReasonWaitingForPreview = "WaitingForPreview"
	// Updating (False)
	ReasonRolloutComplete = "RolloutComplete"
	ReasonHalted          = "Halted"
	ReasonPaused          = "Paused"
	ReasonConfigInvalid   = "ConfigInvalid"
	ReasonNothingToAssign = "NothingToAssign"
	// spec.maintenanceWindows cannot be read (a time zone the database does not know): nothing is assigned.
	ReasonInvalidMaintenanceWindow = "InvalidMaintenanceWindow"

	// Degraded
	ReasonNodesFailed     = "NodesFailed"
	ReasonSelectorOverlap = "SelectorOverlap"
	ReasonAsExpected      = "AsExpected"

	// Halted
	ReasonFailureBudgetExhausted = "FailureBudgetExhausted"
	ReasonWithinFailureBudget    = "WithinFailureBudget"

	// Paused
	ReasonPausedBySpec = "PausedBySpec"
	ReasonNotPaused    = "NotPaused"

	// ConfigInvalid (True reasons are the controller's: ConfigMapNotFound, KeyNotFound,
	// NamespaceNotAllowed, ValidationFailed, ...)
	ReasonConfigMapNotFound   = "ConfigMapNotFound"
	ReasonKeyNotFound         = "KeyNotFound"
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	ReasonValidationFailed    = "ValidationFailed"
	// The kubelet of a node that runs one of the pool's revisions would refuse the new one on the state its
	// resource managers checkpointed (another CPU or memory manager policy, or other reservations under a
	// static one) until the node is drained and the state file removed; a pool does not drain (kubectl dkc
	// assign --drain does).
	ReasonDrainRequired = "DrainRequired"
	// A kubelet restarted with the config would no longer admit pods running on a node that runs one of
	// the pool's revisions (a lower maxPods, larger reservations or eviction thresholds), or would not start
	// at all (reservations over its capacity).
	ReasonCapacityRefused = "CapacityRefused"
	// An object with the snapshot's name that the pool did not create, or whose data is not its revision's.
	ReasonSnapshotMismatch = "SnapshotMismatch"
	ReasonConfigValid      = "ConfigValid"

	// Previewed. True: NoPodsAffected (every node asked answered and found nothing). False: NodesAffected
	// (nodes found pods the restart would stop or evict, state the kubelet would refuse, or a config the
	// node's kubelet refuses). Unknown: WaitingForPreview, NotAllPredicted, PreviewWithdrawn.
	ReasonNoPodsAffected = "NoPodsAffected"
	ReasonNodesAffected  = "NodesAffected"
	// Previewed Unknown: nothing found, but nodes did not answer in time or could not predict (named).
	ReasonNotAllPredicted = "NotAllPredicted"
	// Previewed Unknown: the preview stopped before it completed (the config went back to the current
	// revision, became invalid, or previewTimeout became 0s).
	ReasonPreviewWithdrawn = "PreviewWithdrawn"
)

// Why a node failed a revision (FailedNode.Reason).
const (
	// FailureRolledBack: the node ran the revision and its kubelet did not come up healthy with it; the
	// sidecar rolled it back to last-known-good (or local).
	FailureRolledBack = "RolledBack"
	// FailureConfigRefused: the node refused the revision before running it (it does not load, does not
	// validate with the node kubelet's own code, is too large, ...).
	FailureConfigRefused = "ConfigRefused"
	// FailureTimeout: the node stayed in progress past nodeTimeout.
	FailureTimeout = "Timeout"
	// FailureDrainRequired: the node's sidecar found that the revision needs a drain (the kubelet would
	// refuse it on its resource managers' state) and the pool may not drain (spec.disruption.drain Never).
	FailureDrainRequired = "DrainRequired"
	// FailureDrainFailed: the pool's drain of the node did not finish (a PodDisruptionBudget held past
	// drainTimeout, a pod no controller recreates, an eviction refused); the node is uncordoned.
	FailureDrainFailed = "DrainFailed"
	// FailurePodsFailed: the kubelet failed or evicted a pod that ran on the node before the assignment
	// (OutOfpods, OutOfcpu, OutOfmemory, Evicted, ...) after it was assigned the revision.
	FailurePodsFailed = "PodsFailed"
	// FailurePodsNotReady: a pod that ran on the node before the assignment lost its readiness since and
	// was not Ready again within spec.disruption.podReadinessTimeout.
	FailurePodsNotReady = "PodsNotReady"
)

// MaxHeldNodesListed bounds status.heldNodes: a pool over thousands of nodes without a sidecar must not
// grow its status past what the apiserver stores.
const MaxHeldNodesListed = 100

// Names on the objects the pool's controller writes.
const (
	// LabelPool labels a pool's revision (snapshot ConfigMap) with the pool's name.
	LabelPool = "dkc.dev/pool"
	// LabelRevision labels a revision with its name (the content hash).
	LabelRevision = "dkc.dev/revision"
	// LabelBaseRevision labels a revision of per-node values (spec.perNode) with the pool revision they
	// were computed from.
	LabelBaseRevision = "dkc.dev/base-revision"
	// AnnotationAssignment on a Node records the pool's last assignment to it, as the JSON of an
	// Assignment. A node whose source no longer names the revision recorded here was assigned by hand
	// since: the pool holds it (leaves it alone) until the annotation is removed or the node is set back
	// to the pool's current revision.
	AnnotationAssignment = "dkc.dev/pool-assignment"
)

// Assignment is the value of AnnotationAssignment: which pool assigned the node which revision, and when
// (the start of its nodeTimeout).
type Assignment struct {
	Pool     string `json:"pool"`
	Revision string `json:"revision"`
	// Namespace and KubeletConfigKey are those of the source assigned (the pool's spec.configMap then):
	// a pool whose spec later names another namespace or key must still recognise what it assigned, or
	// its earlier nodes would look assigned by hand and be held forever. Empty in records written before
	// they existed: the pool's current spec is then assumed.
	Namespace        string      `json:"namespace,omitempty"`
	KubeletConfigKey string      `json:"kubeletConfigKey,omitempty"`
	Time             metav1.Time `json:"time"`
}

// The spec's getters apply the schema's defaults to pools that did not come from the apiserver.

// MaxUnavailableOrDefault is spec.maxUnavailable, or its default.
func (s *KubeletConfigPoolSpec) MaxUnavailableOrDefault() intstr.IntOrString {
	if s.MaxUnavailable == nil {
		return intstr.FromInt32(DefaultMaxUnavailable)
	}
	return *s.MaxUnavailable
}

// MaxFailuresOrDefault is spec.maxFailures, or its default; never below 1 (0 would halt before the first
// assignment).
func (s *KubeletConfigPoolSpec) MaxFailuresOrDefault() int32 {
	if s.MaxFailures == nil || *s.MaxFailures < 1 {
		return DefaultMaxFailures
	}
	return *s.MaxFailures
}

// NodeTimeoutOrDefault is spec.nodeTimeout, or its default.
func (s *KubeletConfigPoolSpec) NodeTimeoutOrDefault() time.Duration {
	if s.NodeTimeout == nil || s.NodeTimeout.Duration <= 0 {
		d, _ := time.ParseDuration(DefaultNodeTimeout)
		return d
	}
	return s.NodeTimeout.Duration
}

// RestoresDrift says whether spec.drift.policy is Restore.
func (s *KubeletConfigPoolSpec) RestoresDrift() bool {
	return s.Drift != nil && s.Drift.Policy == DriftRestore
}

// MayDrain says whether spec.disruption.drain is Allowed.
func (s *KubeletConfigPoolSpec) MayDrain() bool {
	return s.Disruption != nil && s.Disruption.Drain == DrainAllowed
}

// DrainTimeoutOrDefault is spec.disruption.drainTimeout, or its default.
func (s *KubeletConfigPoolSpec) DrainTimeoutOrDefault() time.Duration {
	if s.Disruption == nil || s.Disruption.DrainTimeout == nil || s.Disruption.DrainTimeout.Duration <= 0 {
		d, _ := time.ParseDuration(DefaultDrainTimeout)
		return d
	}
	return s.Disruption.DrainTimeout.Duration
}

// PreviewTimeoutOrDefault is spec.disruption.previewTimeout, or its default; 0 turns the preview off.
func (s *KubeletConfigPoolSpec) PreviewTimeoutOrDefault() time.Duration {
	if s.Disruption == nil || s.Disruption.PreviewTimeout == nil || s.Disruption.PreviewTimeout.Duration < 0 {
		d, _ := time.ParseDuration(DefaultPreviewTimeout)
		return d
	}
	return s.Disruption.PreviewTimeout.Duration
}

// PreviewPrefix starts the message of a Node's ConfigPreview condition that answers the preview of
// revision rev of pool that the pool requested at requested: the pool counts only such answers.
func PreviewPrefix(pool, rev string, requested time.Time) string {
	return fmt.Sprintf("revision %s of pool %s (requested %s): ", rev, pool, requested.UTC().Format(time.RFC3339))
}

// PodReadinessTimeoutOrDefault is spec.disruption.podReadinessTimeout, or its default; 0 turns the workload gate
// off.
func (s *KubeletConfigPoolSpec) PodReadinessTimeoutOrDefault() time.Duration {
	if s.Disruption == nil || s.Disruption.PodReadinessTimeout == nil || s.Disruption.PodReadinessTimeout.Duration < 0 {
		d, _ := time.ParseDuration(DefaultPodReadinessTimeout)
		return d
	}
	return s.Disruption.PodReadinessTimeout.Duration
}

// PauseBetweenBatchesOrDefault is spec.pauseBetweenBatches, or 0.
func (s *KubeletConfigPoolSpec) PauseBetweenBatchesOrDefault() time.Duration {
	if s.PauseBetweenBatches == nil || s.PauseBetweenBatches.Duration < 0 {
		return 0
	}
	return s.PauseBetweenBatches.Duration
}

// RevisionHistoryLimitOrDefault is spec.revisionHistoryLimit, or its default.
func (s *KubeletConfigPoolSpec) RevisionHistoryLimitOrDefault() int32 {
	if s.RevisionHistoryLimit == nil || *s.RevisionHistoryLimit < 0 {
		return DefaultRevisionHistoryLimit
	}
	return *s.RevisionHistoryLimit
}
