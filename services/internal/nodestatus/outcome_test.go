package nodestatus

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// emptyLister is a Node cache that has seen no Node yet.
type emptyLister struct{ corelisters.NodeLister }

func (emptyLister) List(labels.Selector) ([]*corev1.Node, error) { return nil, nil }
func (emptyLister) Get(name string) (*corev1.Node, error) {
	return nil, apierrors.NewNotFound(corev1.Resource("nodes"), name)
}

// TestWriteOutcomes: what write does with a node's latest report, as an outcome, for each situation it
// tells apart; steps are writes one after the other, the fake clock stepped between them.
func TestWriteOutcomes(t *testing.T) {
	settled := wire.StatusFromCore(&corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")})
	restarting := wire.StatusFromCore(&corev1.NodeConfigStatus{Assigned: cm("2"), Active: cm("1")})
	for _, tc := range []struct {
		name     string
		node     *corev1.Node // in the apiserver; nil: none
		cached   bool         // in this replica's Node cache too
		report   *report      // the node's latest report here; nil: none
		steps    []time.Duration
		want     []outcome
		reported int // reports held after the steps
	}{
		{name: "no report", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, cached: true,
			steps: []time.Duration{0}, want: []outcome{noReport}},
		{name: "written, then unchanged", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, cached: true,
			report: &report{status: settled}, steps: []time.Duration{0, 0}, want: []outcome{written, unchanged}, reported: 1},
		{name: "a restart in progress is held for its delay, then written", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, cached: true,
			report: &report{status: restarting, restarting: fakeStart}, steps: []time.Duration{0, 9 * time.Second, time.Second},
			want: []outcome{held, held, written}, reported: 1},
		{name: "the cache has not seen the Node yet", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
			report: &report{status: settled}, steps: []time.Duration{0}, want: []outcome{notCached}, reported: 1},
		{name: "the Node is gone: the report goes", report: &report{status: settled},
			steps: []time.Duration{0, 0}, want: []outcome{nodeGone, noReport}},
		{name: "the report is about a deleted object of the name", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "new"}}, cached: true,
			report: &report{status: settled, nodeUID: "old"}, steps: []time.Duration{0}, want: []outcome{otherNode}},
		{name: "the cache lags a Node registered again: kept", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "new"}},
			report: &report{status: settled, nodeUID: "new"}, steps: []time.Duration{0}, want: []outcome{notCached}, reported: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.node != nil {
				client = fake.NewClientset(tc.node)
			}
			var lister corelisters.NodeLister = emptyLister{}
			if tc.cached {
				lister = freshLister{client}
			}
			clk := clocktesting.NewFakeClock(fakeStart)
			w := New(Config{Log: zap.NewNop(), Client: client, Nodes: lister, Table: assignment.NewTable(nil),
				Metrics: NewMetrics(prometheus.NewRegistry()), Clock: clk, RestartingDelay: 10 * time.Second})
			if tc.report != nil {
				w.reports["n1"] = *tc.report
			}
			for i, step := range tc.steps {
				clk.Step(step)
				got, err := w.write(context.Background(), "n1")
				if err != nil {
					t.Fatalf("write %d: %v", i+1, err)
				}
				if got != tc.want[i] {
					t.Errorf("write %d: %v, want %v", i+1, got, tc.want[i])
				}
			}
			if got := w.Reported(); got != tc.reported {
				t.Errorf("%d reports held after the writes, want %d", got, tc.reported)
			}
		})
	}
}

var fakeStart = time.Unix(1_000_000, 0)
