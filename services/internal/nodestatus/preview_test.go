// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// TestPreviewCondition: each verdict's status and reason; the message names what it answers.
func TestPreviewCondition(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		verdict, message string
		status           corev1.ConditionStatus
		reason           string
	}{
		{nodeconfig.PreviewNoPodsAffected, "", corev1.ConditionTrue, nodeconfig.PreviewNoPodsAffected},
		{nodeconfig.PreviewPodsAffected, "pod default/a would be evicted", corev1.ConditionFalse, nodeconfig.PreviewPodsAffected},
		{nodeconfig.PreviewDrainRequired, "cpu manager state", corev1.ConditionFalse, nodeconfig.PreviewDrainRequired},
		{nodeconfig.PreviewConfigRefused, "invalid", corev1.ConditionFalse, nodeconfig.PreviewConfigRefused},
		{nodeconfig.PreviewNotPredicted, "no checkpoint", corev1.ConditionUnknown, nodeconfig.PreviewNotPredicted},
		{"SomethingNew", "x", corev1.ConditionUnknown, nodeconfig.PreviewNotPredicted},
		{"", "", corev1.ConditionUnknown, nodeconfig.PreviewNotPredicted},
		{nodeconfig.PreviewPodsAffected, strings.Repeat("é", nodeconfig.MaxDetailBytes), corev1.ConditionFalse, nodeconfig.PreviewPodsAffected},
	} {
		c := PreviewCondition(&dkcv1.PreviewResult{Pool: "blue", Revision: "abc", RequestTime: timestamppb.New(at),
			Verdict: tc.verdict, Message: tc.message})
		prefix := v1alpha1.PreviewPrefix("blue", "abc", at)
		if c.Type != nodeconfig.PreviewConditionType || c.Status != tc.status || c.Reason != tc.reason ||
			!strings.HasPrefix(c.Message, prefix) || len(c.Message) > len(prefix)+nodeconfig.MaxDetailBytes {
			t.Errorf("verdict %q: %s %s %s (%d bytes), want %s %s, message starting %q, at most %d bytes", tc.verdict,
				c.Type, c.Status, c.Reason, len(c.Message), tc.status, tc.reason, prefix, len(prefix)+nodeconfig.MaxDetailBytes)
		}
		if len(tc.message) < 100 && c.Message != prefix+tc.message {
			t.Errorf("verdict %q: message %q, want %q", tc.verdict, c.Message, prefix+tc.message)
		}
	}
}

// TestPreviewAnswerWritten: a report's answer to the node's current preview is the ConfigPreview
// condition, written in the same patch as the status, inline or from the queue; written once, its
// transition time kept while its status stays. A report without an answer, or answering another request,
// leaves it as it is. An answer that comes before the preview reached this replica is written once it
// does.
func TestPreviewAnswerWritten(t *testing.T) {
	const name = "n1"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	table := assignment.NewTable(nil)
	m := NewMetrics(prometheus.NewRegistry())
	w := New(Config{Log: zap.NewNop(), Client: client, Nodes: freshLister{client}, Table: table, Metrics: m, MaxInlineWrites: 1})
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	preview := func(at time.Time) *dkcv1.Preview {
		return &dkcv1.Preview{Pool: "blue", Revision: "abc", RequestTime: timestamppb.New(at),
			Assignment: &dkcv1.Assignment{ContentHash: "h", Files: map[string]string{"kubelet": "x"}}}
	}
	table.Set(name, assignment.State{Preview: preview(t0)})
	answer := func(at time.Time, verdict string) *dkcv1.PreviewResult {
		return &dkcv1.PreviewResult{Pool: "blue", Revision: "abc", RequestTime: timestamppb.New(at), Verdict: verdict, Message: "found"}
	}
	st := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}
	seq := uint64(0)
	report := func(res *dkcv1.PreviewResult, queued bool) {
		t.Helper()
		if queued {
			release, ok := w.TakeInlineWrite()
			if !ok {
				t.Fatal("no inline write to take")
			}
			defer release()
		}
		seq++
		if _, err := w.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name,
			Status: wire.StatusFromCore(&st), Incarnation: 1, Sequence: seq, Preview: res}); err != nil {
			t.Fatalf("Report: %v", err)
		}
		if queued {
			w.processNext(context.Background())
		}
	}
	condition := func() *corev1.NodeCondition {
		t.Helper()
		n := getNode(t, client, name)
		var found *corev1.NodeCondition
		for i, c := range n.Status.Conditions {
			if c.Type == nodeconfig.PreviewConditionType {
				if found != nil {
					t.Errorf("two ConfigPreview conditions: %+v", n.Status.Conditions)
				}
				found = &n.Status.Conditions[i]
			}
		}
		if n.Annotations[nodeconfig.StatusAnnotation] == "" {
			t.Error("status annotation not written")
		}
		return found
	}
	written := func() float64 { return testutil.ToFloat64(m.writes.WithLabelValues("written")) }
	want := func(step string, status corev1.ConditionStatus, reason string, at time.Time) *corev1.NodeCondition {
		t.Helper()
		c := condition()
		if c == nil || c.Status != status || c.Reason != reason ||
			c.Message != v1alpha1.PreviewPrefix("blue", "abc", at)+"found" {
			t.Fatalf("%s: ConfigPreview %+v, want %s %s answering the request at %v", step, c, status, reason, at)
		}
		return c
	}

	report(answer(t0, nodeconfig.PreviewPodsAffected), false)
	first := want("answered", corev1.ConditionFalse, nodeconfig.PreviewPodsAffected, t0)

	before := written()
	report(answer(t0, nodeconfig.PreviewPodsAffected), false)
	if n := written() - before; n != 0 {
		t.Errorf("the same answer reported again was written %v more times", n)
	}
	report(nil, false)
	want("a report without an answer", corev1.ConditionFalse, nodeconfig.PreviewPodsAffected, t0)
	report(answer(t1, nodeconfig.PreviewNoPodsAffected), false)
	want("an answer to another request", corev1.ConditionFalse, nodeconfig.PreviewPodsAffected, t0)

	report(answer(t0, nodeconfig.PreviewDrainRequired), true)
	c := want("a new answer, queued", corev1.ConditionFalse, nodeconfig.PreviewDrainRequired, t0)
	if !c.LastTransitionTime.Equal(&first.LastTransitionTime) {
		t.Errorf("transition time %v moved while the status stayed False (was %v)", c.LastTransitionTime, first.LastTransitionTime)
	}

	// The pool asks again (t1): the node's answer came first, and is written when the preview does.
	table.Set(name, assignment.State{})
	report(answer(t1, nodeconfig.PreviewNoPodsAffected), false)
	want("an answer before its preview", corev1.ConditionFalse, nodeconfig.PreviewDrainRequired, t0)
	table.Set(name, assignment.State{Preview: preview(t1)})
	w.Enqueue(name)
	w.processNext(context.Background())
	want("its preview arrived", corev1.ConditionTrue, nodeconfig.PreviewNoPodsAffected, t1)
}
