// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// TestDriftWritten: a sidecar's drift finding becomes the ConfigDrift condition, True with its cause, and a
// Warning Event once; a finding of none clears it (False NoDrift), a report without a finding (no check
// yet, an older sidecar) leaves it; a node that never drifted gets no ConfigDrift at all.
func TestDriftWritten(t *testing.T) {
	const name = "n1"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	w := New(Config{Log: zap.NewNop(), Client: client, Nodes: freshLister{client}, Table: assignment.NewTable(nil),
		Metrics: NewMetrics(prometheus.NewRegistry())})
	st := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}
	seq := uint64(0)
	report := func(d *dkcv1.Drift) {
		t.Helper()
		seq++
		if _, err := w.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name,
			Status: wire.StatusFromCore(&st), Incarnation: 1, Sequence: seq, Drift: d}); err != nil {
			t.Fatalf("Report: %v", err)
		}
	}
	condition := func() *corev1.NodeCondition {
		t.Helper()
		for _, c := range getNode(t, client, name).Status.Conditions {
			if c.Type == nodeconfig.DriftConditionType {
				return &c
			}
		}
		return nil
	}
	events := func() []corev1.Event {
		t.Helper()
		l, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []corev1.Event
		for _, e := range l.Items {
			if e.Reason == nodeconfig.DriftEventReason {
				out = append(out, e)
			}
		}
		return out
	}

	none := &dkcv1.Drift{}
	report(none)
	if c := condition(); c != nil {
		t.Fatalf("ConfigDrift %+v on a node that never drifted", c)
	}
	removed := &dkcv1.Drift{Cause: nodeconfig.DriftWiringRemoved, Message: "drop-in 90-dkc.conf is gone"}
	report(removed)
	if c := condition(); c == nil || c.Status != corev1.ConditionTrue || c.Reason != nodeconfig.DriftWiringRemoved ||
		!strings.Contains(c.Message, "90-dkc.conf") {
		t.Fatalf("ConfigDrift %+v, want True WiringRemoved naming the drop-in", c)
	}
	report(removed) // the same finding again: no second Event
	if ev := events(); len(ev) != 1 || ev[0].Type != corev1.EventTypeWarning || ev[0].InvolvedObject.Name != name {
		t.Fatalf("drift events %+v, want one Warning about %s", ev, name)
	}
	report(&dkcv1.Drift{Cause: nodeconfig.DriftFlagOverride, Fields: []string{"maxPods"}, Message: "--max-pods=30 sets it"})
	if c := condition(); c == nil || c.Reason != nodeconfig.DriftFlagOverride || !strings.HasPrefix(c.Message, "fields maxPods: ") {
		t.Fatalf("ConfigDrift %+v, want FlagOverride naming the field", c)
	}
	if ev := events(); len(ev) != 2 {
		t.Fatalf("%d drift events after a new cause, want 2", len(ev))
	}
	report(&dkcv1.Drift{Cause: "SomethingNew"})
	if c := condition(); c == nil || c.Reason != nodeconfig.DriftUnknown {
		t.Fatalf("ConfigDrift %+v for a cause this version does not know, want Unknown", c)
	}
	// A sidecar restarted since, before its first check (or an older one): says nothing, changes nothing.
	report(nil)
	if c := condition(); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("ConfigDrift %+v after a report without a check, want it left True", c)
	}
	report(none)
	if c := condition(); c == nil || c.Status != corev1.ConditionFalse || c.Reason != nodeconfig.DriftNone {
		t.Fatalf("ConfigDrift %+v after a check found none, want False NoDrift", c)
	}
}
