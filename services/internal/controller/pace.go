// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"encoding/json"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// Pacer bounds the nodes changing to a new direct config version at once (pacing.Pacer).
type Pacer interface {
	// Admit says whether node may be given version now; false: it waits for a slot, and is resolved
	// again (Config.Pacer's wake) when one frees.
	Admit(node, version string) bool
	// Done frees node's slot or its place in line: it reported the outcome, or needs no pacing.
	Done(node string)
	// Changing says whether node holds a slot, and for which version.
	Changing(node string) (string, bool)
}

// version names a resolved ConfigMap version, as pacing tells versions apart.
func version(a *dkcv1.Assignment) string {
	c := a.GetSource().GetConfigMap()
	return c.GetNamespace() + "/" + c.GetName() + "/" + c.GetKubeletConfigKey() + "@" +
		c.GetUid() + "/" + c.GetResourceVersion()
}

// isSnapshot says whether cm is a pool's revision snapshot: its pool paces the nodes it assigns, and a
// snapshot is immutable, so no edit of it ever restarts anything.
func isSnapshot(cm *corev1.ConfigMap) bool {
	return cm.Labels[v1alpha1.LabelPool] != "" && cm.Labels[v1alpha1.LabelRevision] != "" &&
		cm.Immutable != nil && *cm.Immutable
}

// reported reads the node's dkc.dev/config-status; ok is false when it has none (or an unreadable one).
func reported(n *corev1.Node) (corev1.NodeConfigStatus, bool) {
	var st corev1.NodeConfigStatus
	raw, ok := n.Annotations[nodeconfig.StatusAnnotation]
	if !ok || json.Unmarshal([]byte(raw), &st) != nil {
		return corev1.NodeConfigStatus{}, false
	}
	return st, true
}

// isVersion says whether a status source is exactly the assignment's ConfigMap version.
func isVersion(s *corev1.NodeConfigSource, a *dkcv1.Assignment) bool {
	c := a.GetSource().GetConfigMap()
	if s == nil || s.ConfigMap == nil || c == nil {
		return false
	}
	sc := s.ConfigMap
	return sc.Namespace == c.GetNamespace() && sc.Name == c.GetName() && sc.KubeletConfigKey == c.GetKubeletConfigKey() &&
		string(sc.UID) == c.GetUid() && sc.ResourceVersion == c.GetResourceVersion()
}

// ready is the Node's Ready condition.
func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// pace decides what node, whose direct source resolved to a, is given now: a, or — while it waits for a
// slot — what this replica gave it before (nil if nothing: the node keeps what it runs). A node given a
// new version takes a slot until its status shows the outcome (it runs it, or reports an error about it).
// Nodes that are not Ready are given it at once and take none: they are out of service already, and a
// fix for what took them down must not wait behind healthy nodes.
func (c *Controller) pace(n *corev1.Node, cm *corev1.ConfigMap, a *dkcv1.Assignment) (
	give *dkcv1.Assignment, held bool) {
	if c.pacer == nil {
		return a, false
	}
	name := n.Name
	if isSnapshot(cm) {
		c.pacer.Done(name)
		return a, false
	}
	st, ok := reported(n)
	prev, had, _ := c.table.Get(name)
	given := had && assignment.SameAssignment(prev.Assignment, a)
	if given || ok && isVersion(st.Assigned, a) {
		// The node has it (from this replica, or from another one or before a restart: its status says so).
		if ok && isVersion(st.Assigned, a) && (isVersion(st.Active, a) || st.Error != "") {
			c.pacer.Done(name)
		}
		return a, false
	}
	if !ready(n) {
		c.pacer.Done(name)
		return a, false
	}
	if c.pacer.Admit(name, version(a)) {
		return a, false
	}
	if had {
		return prev.Assignment, true
	}
	return nil, true
}

// outcomeChanged says whether a Node update may show the outcome a node holding a pacing slot waits for.
func (c *Controller) outcomeChanged(o, n *corev1.Node) bool {
	if c.pacer == nil {
		return false
	}
	if _, ok := c.pacer.Changing(n.Name); !ok {
		return false
	}
	return o.Annotations[nodeconfig.StatusAnnotation] != n.Annotations[nodeconfig.StatusAnnotation] || ready(o) != ready(n)
}

// logHeld notes a node kept on what it runs while it waits for a slot (the pacer logs when it starts
// waiting; this is for debugging each resolution).
func (c *Controller) logHeld(name string, a *dkcv1.Assignment) {
	c.log.Debug("node config change waits for a pacing slot", zap.String("node", name), zap.String("version", version(a)))
}
