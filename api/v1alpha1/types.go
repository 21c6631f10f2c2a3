// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// KubeletConfigPool rolls one kubelet config out to the Nodes its selector picks: as immutable revisions
// (snapshots of the ConfigMap's data, named by content hash), at most maxUnavailable nodes at a time, and
// stopping (Halted) once maxFailures nodes failed the revision. It assigns nodes through the same
// dkc.dev/config-source every node follows, so nothing below the assignment changes. docs/design.md,
// "KubeletConfigPool", states the rules.
//
// The name becomes a label value on the pool's revisions (LabelPool), hence at most 63 characters.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=kcpool,categories=dkc
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Config",type=string,JSONPath=`.spec.configMap.name`,description="the ConfigMap rolled out"
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.configMap.namespace`,priority=1
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.currentRevision`
// +kubebuilder:printcolumn:name="Selected",type=integer,JSONPath=`.status.nodes.selected`
// +kubebuilder:printcolumn:name="Up-to-date",type=integer,JSONPath=`.status.nodes.updated`
// +kubebuilder:printcolumn:name="In-progress",type=integer,JSONPath=`.status.nodes.inProgress`,priority=1
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.nodes.failed`
// +kubebuilder:printcolumn:name="Held",type=integer,JSONPath=`.status.nodes.held`,priority=1
// +kubebuilder:printcolumn:name="Updated",type=string,JSONPath=`.status.conditions[?(@.type=="Updated")].status`
// +kubebuilder:printcolumn:name="Halted",type=string,JSONPath=`.status.conditions[?(@.type=="Halted")].status`
// +kubebuilder:printcolumn:name="Paused",type=boolean,JSONPath=`.spec.paused`,priority=1
// +kubebuilder:printcolumn:name="Next-Window",type=string,JSONPath=`.status.maintenanceWindow.nextOpenTime`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="the pool's name must be at most 63 characters: it labels the pool's revisions"
type KubeletConfigPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec KubeletConfigPoolSpec `json:"spec"`
	// +optional
	Status KubeletConfigPoolStatus `json:"status,omitempty"`
}

// KubeletConfigPoolList is a list of KubeletConfigPools.
//
// +kubebuilder:object:root=true
type KubeletConfigPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubeletConfigPool `json:"items"`
}

// Defaults of the optional spec fields: the schema sets them on every stored pool; code reading a pool that
// did not come from the apiserver (a test, a dry run) applies them through the spec's getters.
const (
	DefaultMaxUnavailable       = 1
	DefaultMaxFailures          = 1
	DefaultNodeTimeout          = "30m"
	DefaultRevisionHistoryLimit = 10
	DefaultDrainTimeout         = "10m"
	DefaultPodReadinessTimeout  = "5m"
	DefaultPreviewTimeout       = "5m"
)

// KubeletConfigPoolSpec is what the operator declares.
type KubeletConfigPoolSpec struct {
	// nodeSelector picks the pool's Nodes by label. An empty selector ({}) selects every Node. A Node that
	// two pools select is touched by neither (the Degraded condition names both).
	// +required
	NodeSelector metav1.LabelSelector `json:"nodeSelector"`

	// configMap is the kubelet config rolled out, with a Node's config source rules
	// (docs/design.md, "Where a Node's config source is read"). Its data is snapshotted into an
	// immutable revision; an edit of the ConfigMap's data is a new revision, rolled out as the first was.
	// +required
	ConfigMap ConfigMapReference `json:"configMap"`

	// paused stops new assignments; nodes already assigned carry on (their sidecars finish what they
	// started) and are still judged.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// maxUnavailable bounds the selected nodes that may be unavailable at once: in progress (assigned the
	// current revision and not yet proven: not active, not Ready, or in its last-known-good trial) or not
	// Ready for any other reason. A number (at least 1) or a percentage of the selected nodes, rounded down
	// and at least 1. Default 1.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')",message="maxUnavailable must be a number of at least 1 or a percentage from 1% to 100%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// maxFailures is how many nodes may fail the current revision (roll it back, refuse it, or miss
	// nodeTimeout) before the pool halts. A halted pool assigns nothing until the revision changes or
	// retry changes. Default 1: dkc-sidecar blames a config only for config faults (its transient errors
	// are not failures), so one failed node is evidence enough to stop pushing the config to the others.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxFailures *int32 `json:"maxFailures,omitempty"`

	// nodeTimeout is how long a node may stay in progress, counted from its assignment, before it counts as
	// failed. In progress includes the node's last-known-good trial, so it must exceed dkc-sidecar's
	// --trial-duration (default 10m) plus a kubelet restart. Default 30m.
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="nodeTimeout must be positive"
	// +optional
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`

	// pauseBetweenBatches, when set, rolls out in batches: the pool assigns up to maxUnavailable nodes, waits
	// until none is in progress, waits this long, then assigns the next batch. Unset or 0: a freed slot is
	// filled at once.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="pauseBetweenBatches must not be negative"
	// +optional
	PauseBetweenBatches *metav1.Duration `json:"pauseBetweenBatches,omitempty"`

	// revisionHistoryLimit is how many revisions besides the current and previous ones are kept for undo.
	// A revision a selected node still runs is never removed. Default 10.
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=0
	// +optional
	RevisionHistoryLimit *int32 `json:"revisionHistoryLimit,omitempty"`

	// retry asks a halted pool to go on: failures recorded while retry had another value no longer count
	// against maxFailures (the failed nodes stay listed and are not assigned again: they keep running their
	// last-known-good config). Set it to a new value each time, e.g. one more than before
	// (`kubectl dkc rollout retry` does).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Retry int64 `json:"retry,omitempty"`

	// maintenanceWindows, when set, are the only times the pool starts assigning nodes: outside all of
	// them nothing new is assigned (an undo's or a retry's assignments included), while a node assigned
	// before finishes what it started and is still judged. status.maintenanceWindow says whether one is
	// open and when the next opens. Unset or empty: the pool may assign at any time.
	// +kubebuilder:validation:MaxItems=20
	// +listType=atomic
	// +optional
	MaintenanceWindows []MaintenanceWindow `json:"maintenanceWindows,omitempty"`

	// disruption says what the pool may do to a node's workloads for a change that needs it. Unset: drain
	// Never.
	// +optional
	Disruption *Disruption `json:"disruption,omitempty"`

	// drift says what the pool does about a node that ran its revision as proven and no longer does (the
	// Node's ConfigDrift condition True: status.nodes.drifted). Unset: policy Report.
	// +optional
	Drift *Drift `json:"drift,omitempty"`

	// perNode computes fields of the kubelet config per Node: each selected node gets the pool's config with
	// its own values (CEL expressions over the Node) and its own unexpired exceptions applied. Each distinct
	// result is a revision of its own, with its own snapshot, checked with the kubelet minors of the nodes it
	// is for before any of them is assigned it; pacing, maxFailures and halts count the nodes across all of
	// them. Unset: every node gets the pool's config as it is.
	// +optional
	PerNode *PerNode `json:"perNode,omitempty"`
}

// PerNode is how a pool's config differs per node.
type PerNode struct {
	// values are fields computed per node, applied in order.
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=field
	// +optional
	Values []PerNodeValue `json:"values,omitempty"`

	// exceptions are patches for one node each, applied over its computed values until they expire.
	// +kubebuilder:validation:MaxItems=100
	// +listType=map
	// +listMapKey=name
	// +optional
	Exceptions []PerNodeException `json:"exceptions,omitempty"`
}

// PerNodeValue is one field of the KubeletConfiguration, computed per node.
type PerNodeValue struct {
	// field is the path of the field in the KubeletConfiguration, with its v1beta1 (JSON) names separated
	// by dots: maxPods, systemReserved.memory. A map key that holds a dot (evictionHard's memory.available)
	// cannot be named: set the whole map (field evictionHard, an expression giving a map). The field is set
	// to the expression's value, replacing what the pool's config holds there; missing parents are created.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9]*(\.[A-Za-z0-9][-A-Za-z0-9_/]*)*$`
	Field string `json:"field"`

	// expression is a CEL expression (the Kubernetes CEL environment of ValidatingAdmissionPolicy, with its
	// quantity, regex, list and string libraries) over the variable node: the Node's metadata (name, labels,
	// annotations) and status (capacity, allocatable, nodeInfo with kubeletVersion). Its value is the
	// field's: a string, number, bool, list or map. Compiled when the pool is synced: an expression that
	// does not compile makes the config invalid (ConfigInvalid names it); one that fails on a node fails
	// that node, which is not touched.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Expression string `json:"expression"`
}

// PerNodeException is a patch of one node's config, until it expires.
type PerNodeException struct {
	// name says why the exception exists (an incident, a ticket): it labels the node's values in status.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// node is the name of the Node it applies to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// patch is a JSON merge patch (RFC 7386) of the node's KubeletConfiguration, applied over its computed
	// values: {maxPods: 200} sets maxPods, {systemReserved: {memory: null}} removes a field.
	// +required
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Patch apiextensionsv1.JSON `json:"patch"`

	// expires is when the exception stops applying: the node is then assigned its config without it, as
	// any change is rolled out. Unset: it applies until removed.
	// +optional
	Expires *metav1.Time `json:"expires,omitempty"`
}

// DriftPolicy says what a pool does about drift.
// +kubebuilder:validation:Enum=Report;Restore
type DriftPolicy string

const (
	// DriftReport: drift is reported (the Drifted condition, status.nodes.drifted), nothing is changed.
	DriftReport DriftPolicy = "Report"
	// DriftRestore: a node whose drift dkc can repair (its wiring of the kubelet removed or replaced:
	// WiringRemoved, WiringReplaced) is repaired once within the pool's pacing: its sidecar puts the wiring
	// back and restarts the kubelet into the config it was assigned. Drift of another cause (a kubelet flag
	// or a --config-dir drop-in the node's owner set) is reported only.
	DriftRestore DriftPolicy = "Restore"
)

// Drift is what a pool does about drift.
type Drift struct {
	// policy: Report (default) or Restore. Restore takes a slot of maxUnavailable per node repaired, only
	// while the pool may assign (not paused or halted, a maintenance window open), and repairs a node at
	// most once per cause for the config it was assigned: the same cause found again after the repair is
	// reported, not repaired again, until the node is assigned another config.
	// +kubebuilder:default=Report
	// +optional
	Policy DriftPolicy `json:"policy,omitempty"`
}

// DrainPolicy says whether a pool may drain nodes.
// +kubebuilder:validation:Enum=Never;Allowed
type DrainPolicy string

const (
	// DrainNever: a change that needs a drain is refused before any node is touched (ConfigInvalid,
	// reason DrainRequired); a node whose sidecar finds that it needs one fails the revision.
	DrainNever DrainPolicy = "Never"
	// DrainAllowed: a node whose sidecar says the change needs a drain is cordoned and drained, then its
	// sidecar removes the kubelet state the change invalidates and restarts the kubelet into it.
	DrainAllowed DrainPolicy = "Allowed"
)

// Disruption is what a pool may do to a node's workloads (in the spirit of the Machine Config Operator's
// NodeDisruptionPolicy). Today one change needs more than a kubelet restart: one the kubelet refuses to
// start with on the state its CPU or memory manager checkpointed (another policy, or other reservations
// under the static ones), which needs the node drained and that state removed.
type Disruption struct {
	// drain: Never (default) or Allowed. Allowed: such a node, once assigned, is cordoned (unless it was
	// already), its pods are evicted through the Eviction API (PodDisruptionBudgets hold; DaemonSet and
	// mirror pods stay; pods no controller recreates fail the drain), its sidecar removes exactly the state
	// the change invalidates with the kubelet stopped and restarts the kubelet, and the node is uncordoned
	// once it runs the revision (or failed it). The node counts as in progress, within maxUnavailable,
	// throughout.
	// +kubebuilder:default=Never
	// +optional
	Drain DrainPolicy `json:"drain,omitempty"`

	// drainTimeout bounds a node's drain: evictions a PodDisruptionBudget refuses are retried until then,
	// and a drain not done by then fails the node (counted against maxFailures); the node is uncordoned and
	// keeps the config it runs. Default 10m.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="drainTimeout must be positive"
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// podReadinessTimeout gates each node on its workloads: a node whose kubelet restarted into the revision
	// counts as in progress until every pod that ran there before the assignment and lost its readiness
	// since is Ready again (a 1.34 kubelet's restart sets every container not Ready until its probes pass),
	// and a pod still not Ready this long after it lost readiness fails the node. A pod the kubelet failed
	// or evicted since the assignment (OutOfpods, OutOfcpu, Evicted, ...) fails the node at once. "0s"
	// turns the gate off. Default 5m.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="podReadinessTimeout must not be negative"
	// +optional
	PodReadinessTimeout *metav1.Duration `json:"podReadinessTimeout,omitempty"`

	// previewTimeout bounds the preview of a new revision: before assigning it to any node, the pool asks
	// the sidecars of the selected nodes that do not run it what it would do there (status.preview), and
	// waits for their answers (each Node's ConfigPreview condition) this long at most. A node that does not
	// answer in time (no sidecar connected, an older one) is named in the Previewed condition and does not
	// block; its sidecar still checks before its restart. With findings (pods the restarted kubelet would
	// stop or evict, state it would refuse, a config the node's kubelet refuses), a pool that may not drain
	// refuses the revision (ConfigInvalid), one that may drain goes on and drains those nodes. "0s" turns
	// the preview off. Default 5m.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="previewTimeout must not be negative"
	// +optional
	PreviewTimeout *metav1.Duration `json:"previewTimeout,omitempty"`
}

// MaintenanceWindow is a time of the week when a pool may start assigning nodes. It opens on each of its
// days at start, in timeZone, and stays open for duration, which may run into the next day. Windows that
// overlap or touch are one stretch of open time.
type MaintenanceWindow struct {
	// days the window opens on, in timeZone. Empty: every day.
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	// +optional
	Days []Weekday `json:"days,omitempty"`

	// start is when the window opens on each of its days: HH:MM, a 24-hour clock in timeZone.
	// +required
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	Start string `json:"start"`

	// duration is how long the window stays open: from 1m to 168h.
	// +required
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="duration must be from 1m to 168h"
	Duration metav1.Duration `json:"duration"`

	// timeZone is the IANA time zone of days and start, e.g. Europe/Berlin. Default UTC. A name the time
	// zone database does not know stops the pool's assignments (the Updating condition says so).
	// +kubebuilder:default=UTC
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +optional
	TimeZone string `json:"timeZone,omitempty"`
}

// Weekday is a day of the week as maintenance windows name it.
// +kubebuilder:validation:Enum=Mon;Tue;Wed;Thu;Fri;Sat;Sun
type Weekday string

// ConfigMapReference names the kubelet config: a core/v1 ConfigMapNodeConfigSource without uid and
// resourceVersion, which are the result of resolving a source, never part of one. The patterns are the
// apiserver's rules for Node.spec.configSource (package resolve applies the same ones to the
// dkc.dev/config-source annotation); fields this type lacks are refused by kubectl's strict field
// validation and dropped by the apiserver otherwise.
type ConfigMapReference struct {
	// namespace of the ConfigMap: a DNS label; it must be one of dkc-server's --config-namespaces, and the
	// pool's revisions are created there.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// name of the ConfigMap: a DNS subdomain.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// kubeletConfigKey is the data key holding the KubeletConfiguration: a ConfigMap key.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +kubebuilder:validation:XValidation:rule="self != '.' && !self.startsWith('..')",message="kubeletConfigKey must not be '.' or start with '..'"
	KubeletConfigKey string `json:"kubeletConfigKey"`
}

// KubeletConfigPoolStatus is what the controller observed and did.
type KubeletConfigPoolStatus struct {
	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// currentRevision is the revision being rolled out (or rolled out): the content hash of the config.
	// +optional
	CurrentRevision string `json:"currentRevision,omitempty"`
	// previousRevision is the revision before it: what an undo assigns.
	// +optional
	PreviousRevision string `json:"previousRevision,omitempty"`

	// nodes counts the selected nodes by state.
	// +optional
	Nodes NodeCounts `json:"nodes,omitempty"`

	// conditions: Updated, Updating, Degraded, Halted, Paused, ConfigInvalid (the Condition* constants).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// failedNodes are the nodes that failed the current revision, with their status error. A node stays
	// here until the revision changes, even if it recovers, is deleted or leaves the pool: a node that
	// rolled back runs its last-known-good config and is Ready again, counting it as available would push
	// the bad config on, and so would forgetting a failed node that auto-repair replaced. A new spec.retry
	// stops counting it against maxFailures (retry) and keeps it listed.
	// +listType=map
	// +listMapKey=name
	// +optional
	FailedNodes []FailedNode `json:"failedNodes,omitempty"`

	// heldNodes are the held nodes, by name, with why the pool leaves each alone: at most the first 100
	// (nodes.held counts them all).
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	// +optional
	HeldNodes []HeldNode `json:"heldNodes,omitempty"`

	// lastAssignmentTime is when the pool last assigned nodes.
	// +optional
	LastAssignmentTime *metav1.Time `json:"lastAssignmentTime,omitempty"`
	// batchCompletionTime is when the pool first saw no node in progress after its last assignment: the
	// start of pauseBetweenBatches.
	// +optional
	BatchCompletionTime *metav1.Time `json:"batchCompletionTime,omitempty"`

	// revisionSnapshots are the revision snapshots the pool's controller created, with their UIDs: the
	// controller assigns a revision, and dkc-server serves its snapshot, only as recorded here. Absent in a
	// status written by a dkc that did not record them: the controller then adopts, once, the snapshots
	// whose data hash to their revision (docs/pools.md, "Revision snapshots").
	// +optional
	RevisionSnapshots *RevisionSnapshots `json:"revisionSnapshots,omitempty"`

	// maintenanceWindow is where the pool stands with spec.maintenanceWindows when the status was written
	// (the controller writes it again when a window opens or closes); absent when the pool has none.
	// +optional
	MaintenanceWindow *MaintenanceWindowStatus `json:"maintenanceWindow,omitempty"`

	// preview is the pool's request to the selected nodes' sidecars to preview a revision before any node
	// is assigned it (spec.disruption.previewTimeout): the dkc-server replicas send it to the nodes they
	// serve until completionTime is set, and each answer is the Node's ConfigPreview condition, whose
	// message starts with PreviewPrefix. Absent when no revision was previewed.
	// +optional
	Preview *PreviewStatus `json:"preview,omitempty"`

	// nodeRevisions, with spec.perNode, are the revisions the current revision's per-node values make: each
	// with the values it holds, how many selected nodes are to run it and how many do. At most the first 100.
	// +listType=map
	// +listMapKey=revision
	// +kubebuilder:validation:MaxItems=100
	// +optional
	NodeRevisions []NodeRevision `json:"nodeRevisions,omitempty"`
}

// NodeRevision is one revision a pool's per-node values make of its current revision.
type NodeRevision struct {
	// revision is its name: the hash of the computed config, as any revision's.
	Revision string `json:"revision"`
	// values are the fields computed (field=value, the value as JSON) and the exceptions applied
	// (exception NAME), in the spec's order.
	// +listType=atomic
	// +optional
	Values []string `json:"values,omitempty"`
	// nodes is how many selected nodes are to run it.
	Nodes int32 `json:"nodes"`
	// updated is how many of them run it and have it as last-known-good.
	// +optional
	Updated int32 `json:"updated,omitempty"`
}

// PreviewStatus is a pool's request for a preview of one revision.
type PreviewStatus struct {
	// revision is the revision previewed.
	Revision string `json:"revision"`
	// requestTime is when the pool asked; answers made before it are not answers to it.
	RequestTime metav1.Time `json:"requestTime"`
	// completionTime is when the pool stopped waiting: every node answered, or previewTimeout passed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// MaintenanceWindowStatus is where a pool stands with its maintenance windows.
type MaintenanceWindowStatus struct {
	// open: a window is open, and the pool may start assigning nodes.
	Open bool `json:"open"`
	// closeTime is when the open window closes; absent while none is open, or when they never close.
	// +optional
	CloseTime *metav1.Time `json:"closeTime,omitempty"`
	// nextOpenTime is when the next window opens (the next after the open one, while one is open).
	// +optional
	NextOpenTime *metav1.Time `json:"nextOpenTime,omitempty"`
}

// RevisionSnapshots are the snapshots a pool's controller created. It is a pointer in the status, so that
// a pool that records none (yet) is told from one whose status predates the record.
type RevisionSnapshots struct {
	// items, one per revision kept.
	// +listType=map
	// +listMapKey=revision
	// +optional
	Items []RevisionSnapshot `json:"items,omitempty"`
}

// RevisionSnapshot is one snapshot ConfigMap as the controller created it.
type RevisionSnapshot struct {
	// revision the snapshot freezes: the hash of its namespace, kubeletConfigKey and data.
	Revision string `json:"revision"`
	// namespace of the snapshot ConfigMap.
	Namespace string `json:"namespace"`
	// name of the snapshot ConfigMap: <pool>-<revision>.
	Name string `json:"name"`
	// uid of the snapshot ConfigMap the controller created: an object of that name with another UID was
	// created by someone else, or deleted and created again.
	UID types.UID `json:"uid"`
	// kubeletConfigKey the revision was hashed with.
	KubeletConfigKey string `json:"kubeletConfigKey"`
	// baseRevision, for a snapshot of per-node values (spec.perNode), is the pool revision they were
	// computed from; absent for a snapshot of the pool's ConfigMap.
	// +optional
	BaseRevision string `json:"baseRevision,omitempty"`
}

// Snapshot returns the record of revision's snapshot; false if there is none.
func (r *RevisionSnapshots) Snapshot(revision string) (RevisionSnapshot, bool) {
	if r == nil {
		return RevisionSnapshot{}, false
	}
	for _, s := range r.Items {
		if s.Revision == revision {
			return s, true
		}
	}
	return RevisionSnapshot{}, false
}

// NodeCounts counts the selected nodes. Every selected node is in exactly one of updated, drifted,
// inProgress, failed, held, or none of them (not yet assigned the current revision); ready is the updated
// nodes that are Ready.
type NodeCounts struct {
	// selected: the nodes the nodeSelector picks.
	Selected int32 `json:"selected"`
	// updated: the nodes that run the current revision and have it as last-known-good.
	Updated int32 `json:"updated"`
	// ready: the updated nodes that are Ready.
	Ready int32 `json:"ready"`
	// inProgress: the nodes assigned the current revision and not yet proven.
	InProgress int32 `json:"inProgress"`
	// failed: the nodes in failedNodes.
	Failed int32 `json:"failed"`
	// held: the nodes the pool leaves alone: assigned by hand, selected by another pool too, not run by
	// the dkc sidecar, or whose sidecar never reported (heldNodes says which).
	Held int32 `json:"held"`
	// drifted: the nodes that were updated, and whose kubelet runs something else than the revision since
	// (their ConfigDrift condition is True: dkc's wiring removed, a flag or drop-in overriding a field, the
	// kubelet's minor changed): the Drifted condition names them.
	// +optional
	Drifted int32 `json:"drifted,omitempty"`
}

// HeldNode is a node the pool leaves alone.
type HeldNode struct {
	// name of the Node.
	Name string `json:"name"`
	// reason: HandAssigned (its source was set by hand after the pool assigned it), SelectedByOtherPools,
	// NoSidecar (the sidecar DaemonSet does not run on it: not Linux, or labelled dkc.dev/sidecar=disabled)
	// or NotReported (its sidecar never reported a status: assigned once it has).
	Reason string `json:"reason"`
}

// FailedNode is a node that failed the current revision.
type FailedNode struct {
	// name of the Node.
	Name string `json:"name"`
	// revision it failed: the current revision, or with spec.perNode the node's own revision of it (one of
	// nodeRevisions).
	Revision string `json:"revision"`
	// poolRevision, with spec.perNode, is the pool revision whose per-node values the node failed: the
	// failure stands, even once the node is gone, while it is the pool's current revision and the node's own
	// revision of it is the one it failed.
	// +optional
	PoolRevision string `json:"poolRevision,omitempty"`
	// reason: RolledBack, ConfigRefused or Timeout (the Failure* constants).
	Reason string `json:"reason"`
	// error: the node's status error (its dkc.dev/config-status), or what the node was waiting for at
	// the timeout.
	// +optional
	Error string `json:"error,omitempty"`
	// retry is spec.retry when the failure was recorded: it counts against maxFailures only while
	// spec.retry keeps this value.
	// +optional
	Retry int64 `json:"retry,omitempty"`
	// time the failure was recorded.
	Time metav1.Time `json:"time"`
}
