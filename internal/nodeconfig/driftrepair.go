// SPDX-License-Identifier: Apache-2.0

package nodeconfig

import (
	"encoding/json"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DriftRepairAnnotation on a Node is a pool's request (spec.drift.policy: Restore) that the node's sidecar
// repair the drift its ConfigDrift condition reports: put dkc's wiring of the kubelet back and restart the
// kubelet once into the config it was assigned. The JSON of a DriftRepair, bound to one ConfigMap version
// and one cause: a request left behind asks nothing of a node assigned another config since, and the pool
// never asks twice for the same cause and version — that cause found again after the repair is reported,
// not repaired in a loop. dkc-server sends a request that names the node's assignment to its sidecar
// (WatchConfigResponse.drift_repair).
const DriftRepairAnnotation = "dkc.dev/drift-repair"

// DriftRepair is the value of DriftRepairAnnotation.
type DriftRepair struct {
	// Cause is the drift cause to repair (a ConfigDrift reason RepairableDrift accepts).
	Cause string `json:"cause"`
	// UID and ResourceVersion are the ConfigMap version the node was assigned when the pool asked.
	UID             types.UID `json:"uid"`
	ResourceVersion string    `json:"resourceVersion"`
	// RequestTime is when the pool asked; it names the request (ID).
	RequestTime time.Time `json:"requestTime"`
}

// ID names the request: its time, RFC 3339 with nanoseconds.
func (r DriftRepair) ID() string { return r.RequestTime.UTC().Format(time.RFC3339Nano) }

// MarshalDriftRepair is the annotation's value.
func MarshalDriftRepair(r DriftRepair) string {
	r.RequestTime = r.RequestTime.UTC()
	b, _ := json.Marshal(r) // strings and a time: cannot fail
	return string(b)
}

// DriftRepairOf is the request the node's annotation holds; false when it has none or one that does not
// parse (which names nothing).
func DriftRepairOf(n *corev1.Node) (DriftRepair, bool) {
	v, ok := n.Annotations[DriftRepairAnnotation]
	if !ok {
		return DriftRepair{}, false
	}
	var r DriftRepair
	if err := json.Unmarshal([]byte(v), &r); err != nil || r.Cause == "" || r.UID == "" || r.RequestTime.IsZero() {
		return DriftRepair{}, false
	}
	return r, true
}

// For says whether the request is for the ConfigMap version uid/resourceVersion.
func (r DriftRepair) For(uid types.UID, resourceVersion string) bool {
	return r.UID == uid && r.ResourceVersion == resourceVersion
}

// repairableDrift are the causes a sidecar repairs: dkc's own wiring, which it can put back. A kubelet flag
// or a --config-dir drop-in is the node owner's, and a new kubelet minor is an upgrade's.
var repairableDrift = []string{DriftWiringRemoved, DriftWiringReplaced}

// RepairableDrift says whether a sidecar repairs drift of this cause.
func RepairableDrift(cause string) bool { return slices.Contains(repairableDrift, cause) }
