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
// and one drift: the cause, and the time the Node's ConfigDrift condition turned True. dkc-server sends a
// request to the node's sidecar (WatchConfigResponse.drift_repair) only while it is Live — the node still
// runs that version and that drift stands — so a request left behind asks nothing of a later drift or
// another config. The pool never asks twice for one cause and version (Asked): that cause found again
// after the repair is reported, not repaired in a loop.
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
	// DriftSince is when the ConfigDrift condition the pool answered turned True (its lastTransitionTime):
	// the drift the request is about.
	DriftSince time.Time `json:"driftSince"`
	// Asked are the causes the pool asked to repair before on this version, Cause aside.
	Asked []string `json:"asked,omitempty"`
}

// ID names the request: its time, RFC 3339 with nanoseconds.
func (r DriftRepair) ID() string { return r.RequestTime.UTC().Format(time.RFC3339Nano) }

// MarshalDriftRepair is the annotation's value.
func MarshalDriftRepair(r DriftRepair) string {
	r.RequestTime, r.DriftSince = r.RequestTime.UTC(), r.DriftSince.UTC()
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

// Live says whether the request is about the drift n shows now: its ConfigDrift condition True since
// DriftSince, with Cause as its reason.
func (r DriftRepair) Live(n *corev1.Node) bool {
	cause, since, ok := DriftOf(n)
	return ok && cause == r.Cause && since.Equal(r.DriftSince)
}

// AskedFor says whether the pool asked to repair cause on this version before, this request included.
func (r DriftRepair) AskedFor(cause string) bool {
	return r.Cause == cause || slices.Contains(r.Asked, cause)
}

// DriftOf is n's ConfigDrift condition when True: its cause (reason) and when it turned True.
func DriftOf(n *corev1.Node) (cause string, since time.Time, ok bool) {
	for _, c := range n.Status.Conditions {
		if c.Type == DriftConditionType && c.Status == corev1.ConditionTrue {
			return c.Reason, c.LastTransitionTime.Time, true
		}
	}
	return "", time.Time{}, false
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
