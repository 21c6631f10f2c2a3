// SPDX-License-Identifier: Apache-2.0

package nodeconfig

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DrainedAnnotation on a Node says that whoever drained it (kubectl dkc assign --drain, a pool with
// spec.disruption.drain: Allowed) drained it for exactly one ConfigMap version: the JSON of a Drained. While
// the Node is also unschedulable and its source resolves to that version, the node's sidecar may remove the
// kubelet state the change invalidates (docs/pools.md, "Changes that need a drain"). Bound to the version, a
// mark left behind never lets a later change reset the state of a node whose pods came back.
const DrainedAnnotation = "dkc.dev/drained"

// Drained is the value of DrainedAnnotation. Empty UID and resourceVersion name the node's local config
// (kubectl dkc reset --drain): going back to it can need a drain as much as leaving it.
type Drained struct {
	UID             types.UID `json:"uid"`
	ResourceVersion string    `json:"resourceVersion"`
}

// MarshalDrained is the annotation's value for a ConfigMap version ("", "": the local config).
func MarshalDrained(uid types.UID, resourceVersion string) string {
	b, _ := json.Marshal(Drained{UID: uid, ResourceVersion: resourceVersion}) // two strings: cannot fail
	return string(b)
}

// IsDrainedFor says whether the node is cordoned and drained for the ConfigMap version uid/resourceVersion
// ("", "": the local config): it is unschedulable, its DrainedAnnotation names exactly that version, and
// its status does not say yet that it runs that version. Once it does, the drain has served: a mark left
// behind, on a node cordoned again later for another reason, allows nothing. A mark that does not parse
// names nothing.
func IsDrainedFor(n *corev1.Node, uid types.UID, resourceVersion string) bool {
	v, ok := n.Annotations[DrainedAnnotation]
	if !ok || !n.Spec.Unschedulable {
		return false
	}
	var d Drained
	if err := json.Unmarshal([]byte(v), &d); err != nil || d.UID != uid || d.ResourceVersion != resourceVersion {
		return false
	}
	var st corev1.NodeConfigStatus
	if raw, ok := n.Annotations[StatusAnnotation]; ok && json.Unmarshal([]byte(raw), &st) == nil && st.Error == "" {
		active := st.Active
		runs := active == nil || active.ConfigMap == nil // the local config
		if uid != "" {
			runs = active != nil && active.ConfigMap != nil && active.ConfigMap.UID == uid &&
				active.ConfigMap.ResourceVersion == resourceVersion
		}
		if runs {
			return false
		}
	}
	return true
}
