package nodestatus

import (
	"context"
	"fmt"
	"regexp"

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
// (or the same report reaching two replicas) creates it once.
func (w *Writer) recordRestart(ctx context.Context, node string, r *dkcv1.KubeletRestart) error {
	if !ValidRestartID(r.GetId()) {
		return fmt.Errorf("restart id %q of node %s: want 1-64 characters of [a-z0-9]", r.GetId(), node)
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
	_, err := w.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		w.metrics.event("duplicate")
		return nil
	}
	if err != nil {
		return fmt.Errorf("create %s event %s for node %s: %w", nodeconfig.EventReason, ev.Name, node, err)
	}
	w.metrics.event("created")
	w.log.Info("kubelet restart recorded", zap.String("node", node), zap.String("message", msg))
	return nil
}
