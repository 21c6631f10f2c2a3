// SPDX-License-Identifier: Apache-2.0

// Reports of Nodes that are gone, or of Node objects deleted and registered again, and of nodes another
// replica serves.

package nodestatus

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// dropIfGone handles a node whose report is held but whose Node — the object nodeUID, if not "" — the cache
// does not hold: either the Node is new and this replica's cache has not seen it yet (keep the report,
// notCached), or it was deleted — by Forget, or as a late report arrived — and the report goes (nodeGone;
// otherNode if the report named its object), so that reports follow the live Nodes. The
// cache cannot tell the two apart, so the apiserver is asked: a list by name, which is a quorum read and
// within the service's RBAC (nodes list/watch, no get). The node's lock is held by the caller, and only the
// report that was checked is dropped: a newer one (from a Node created again meanwhile) is kept and gets
// its own check when its Report writes.
func (w *Writer) dropIfGone(ctx context.Context, name, nodeUID string) (outcome, error) {
	w.mu.Lock()
	checked := w.latestLocked(name)
	var checkedUID string
	if checked != nil {
		checkedUID = checked.nodeUID
	}
	w.mu.Unlock()
	if checked == nil {
		return noReport, nil
	}
	if checkedUID != nodeUID {
		return notCached, nil // a newer report (about another object) came meanwhile: its own write checks it
	}
	list, err := w.client.CoreV1().Nodes().List(ctx,
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return 0, fmt.Errorf("check whether node %s exists: %w", name, err)
	}
	for _, n := range list.Items {
		if n.Name == name && (nodeUID == "" || string(n.UID) == nodeUID) {
			return notCached, nil
		}
	}
	w.mu.Lock()
	if s := w.state[name]; s != nil && s.report == checked {
		s.dropReport()
		w.tidyLocked(name)
	}
	w.mu.Unlock()
	if nodeUID != "" {
		w.log.Info("node object gone; dropped its status report", zap.String("node", name), zap.String("nodeUID", nodeUID))
		return otherNode, nil
	}
	w.log.Info("node gone; dropped its status report", zap.String("node", name))
	return nodeGone, nil
}

// release drops the node's report checked, if it is still the latest: another replica serves the node (see
// Config.Serving). A newer one came with the node's stream to this replica, and is written.
func (w *Writer) release(node string, checked *report) {
	l := w.lock(node)
	l.Lock()
	defer l.Unlock()
	w.mu.Lock()
	held := false
	if s := w.state[node]; s != nil && s.report == checked {
		held = checked != nil
		s.dropReport() // its queued Events stay: they are still this replica's promise
		w.tidyLocked(node)
	}
	w.mu.Unlock()
	if held {
		w.log.Debug("node served by another replica; dropped its status report", zap.String("node", node))
	}
}
