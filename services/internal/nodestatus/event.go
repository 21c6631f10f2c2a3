// SPDX-License-Identifier: Apache-2.0

// Kubelet restart Events: created inline or from the queue, and which failures are final.

package nodestatus

import (
	"context"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

var restartID = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// ValidRestartID reports whether a KubeletRestart id can name an Event.
func ValidRestartID(id string) bool { return restartID.MatchString(id) }

// recordRestart creates the restart's Event, named after the node and restart id so that a retried report
// (or the same report reaching two replicas) creates it once. A restart whose Event this replica recorded
// already asks nothing of the apiserver.
func (w *Writer) recordRestart(ctx context.Context, node string, r *dkcv1.KubeletRestart) error {
	if !ValidRestartID(r.GetId()) {
		return fmt.Errorf("restart id %q of node %s: want 1-64 characters of [a-z0-9]", r.GetId(), node)
	}
	if w.eventKnown(node, r.GetId()) {
		w.metrics.event("known")
		return nil
	}
	t := metav1.NewTime(r.GetTime().AsTime())
	if r.GetTime() == nil {
		t = metav1.NewTime(w.clock.Now())
	}
	msg := nodeconfig.EventMessage(wire.SourceToCore(r.GetTarget()))
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: node + "." + r.GetId(), Namespace: metav1.NamespaceDefault},
		// As the original: the Node's UID is its name for events about it.
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)},
		Reason:         nodeconfig.EventReason,
		Message:        msg,
		Type:           corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "dkc-sidecar", Host: node},
		FirstTimestamp: t,
		LastTimestamp:  t,
		Count:          1,
	}
	_, err := w.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev,
		metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		w.noteEvent(node, r.GetId())
		w.metrics.event("duplicate")
		return nil
	}
	if err != nil {
		return fmt.Errorf("create %s event %s for node %s: %w", nodeconfig.EventReason, ev.Name, node, err)
	}
	w.noteEvent(node, r.GetId())
	w.metrics.event("created")
	// Per restart and node: debug. The Event is the record; "node status written" says what came of it.
	w.log.Debug("kubelet restart recorded", zap.String("node", node), zap.String("message", msg))
	return nil
}

// recordDrift creates a Warning Event on the Node whose ConfigDrift condition this replica just turned True
// (cond), so that `kubectl describe node` and event-based alerting show it beside the kubelet's own. Its
// name is the node's and a digest of the condition, so that two replicas writing the same finding create
// one. Best effort: the condition is the record, and a failure is logged, not retried.
func (w *Writer) recordDrift(ctx context.Context, name string, cond corev1.NodeCondition) {
	h := fnv.New32a()
	h.Write([]byte(cond.Reason + "\x00" + cond.Message))
	now := metav1.NewTime(w.clock.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.drift-%08x", name, h.Sum32()),
			Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: name, UID: types.UID(name)},
		Reason:         nodeconfig.DriftEventReason,
		Message:        cond.Reason + ": " + cond.Message,
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "dkc-sidecar", Host: name},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	_, err := w.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev,
		metav1.CreateOptions{FieldManager: FieldManager})
	switch {
	case err == nil:
		w.metrics.event("created")
		w.log.Warn("kubelet config drift recorded", zap.String("node", name), zap.String("cause", cond.Reason),
			zap.String("message", cond.Message))
	case apierrors.IsAlreadyExists(err):
		w.metrics.event("duplicate")
	default:
		w.metrics.event("error")
		w.log.Warn("could not record the kubelet config drift event; the ConfigDrift condition shows it",
			zap.String("node", name), zap.Error(err))
	}
}

// eventKnown says whether node's restart id has its Event, as this replica learnt within eventGiveUp.
func (w *Writer) eventKnown(node, id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.state[node]
	return s != nil && s.eventRecorded(id, w.clock.Now())
}

// noteEvent records that node's restart id has its Event.
func (w *Writer) noteEvent(node, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stateLocked(node).noteRecorded(id, w.clock.Now())
}

// eventGiveUp is how long a queued Event is retried: as long as the sidecar keeps a restart acknowledged as
// queued to send it again (outbox.ParkedRestartTTL), the apiserver's default --event-ttl. An Event still
// failing after an hour is news nobody reads on time.
const eventGiveUp = time.Hour

// maxPendingEvents bounds the restarts kept per node for the queue. A sidecar sends its next restart only
// once the previous report is acknowledged, so more than a few mean a kubelet restarting in a loop while
// the apiserver refuses Events: the oldest go, as an event recorder's would.
const maxPendingEvents = 16

// queuedEvent is a queued report's restart, and when this replica queued it (its own clock: the restart's
// time is the node's).
type queuedEvent struct {
	restart *dkcv1.KubeletRestart
	since   time.Time
}

// addEventLocked keeps a queued report's restart for flushEvents; w.mu is held.
func (w *Writer) addEventLocked(node string, rs *dkcv1.KubeletRestart) {
	if dropped := w.stateLocked(node).addEvent(rs, w.clock.Now()); dropped != nil {
		w.log.Warn("too many kubelet restarts waiting for their events; dropping the oldest", zap.String("node", node),
			zap.String("restartID", dropped.GetId()))
		w.metrics.event("error")
	}
}

// flushEvents creates the Events of the node's queued restarts, oldest first. An Event the apiserver
// refuses for good is dropped, as on the inline path; a transient failure keeps it and the rest, and is
// returned so that the node is queued again.
func (w *Writer) flushEvents(ctx context.Context, node string) error {
	for {
		// Only this worker removes a node's events (the queue hands a node to one worker at a time);
		// reports may append more meanwhile.
		w.mu.Lock()
		var qe queuedEvent
		s := w.state[node]
		ok := s != nil && len(s.events) > 0
		if ok {
			qe = s.events[0]
		}
		w.mu.Unlock()
		if !ok {
			return nil
		}
		rs := qe.restart
		if err := w.recordRestart(ctx, node, rs); err != nil {
			w.metrics.event("error")
			switch {
			case eventRefused(err):
				w.log.Warn("kubelet restart event refused; dropping it", zap.String("node", node),
					zap.String("restartID", rs.GetId()), zap.String("reason", string(apierrors.ReasonForError(err))), zap.Error(err))
			case w.clock.Since(qe.since) > eventGiveUp:
				w.log.Warn("kubelet restart event queued over an hour ago and still failing; dropping it", zap.String("node", node),
					zap.String("restartID", rs.GetId()), zap.Error(err))
			default:
				return err
			}
		}
		w.mu.Lock()
		if s := w.state[node]; s != nil {
			s.eventCreated(rs)
			w.tidyLocked(node)
		}
		w.mu.Unlock()
	}
}

// namespaceLifecycleNotReady is how a kube-apiserver that has just started refuses a create in any
// namespace until its NamespaceLifecycle admission has synced: a 403 that is over in a second or two, not a
// refusal of the Event (k8s.io/apiserver, plugin/namespace/lifecycle). Taken for one, it dropped the Event
// of a restart made while the apiserver restarted (TestFaultsDuringRollouts, once on a new machine).
const namespaceLifecycleNotReady = "not yet ready to handle request"

// eventRefused says whether the apiserver refused an Event for good (quota, admission, validation): retrying
// the same Event cannot help. Anything else (timeouts, throttling, server errors, the connection) may.
func eventRefused(err error) bool {
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), namespaceLifecycleNotReady) {
		return false
	}
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err)
}
