// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
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
		want     []outcome // a zero outcome: the write fails
		reported int       // reports held after the steps
		// patchRefused: the apiserver refuses the status patch with a Conflict (the UID precondition);
		// listedGone: its list by name finds no Node.
		patchRefused, listedGone bool
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
		{name: "a patch refused, the object still there: an error, retried", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}}, cached: true,
			report: &report{status: settled, nodeUID: "u1"}, patchRefused: true, steps: []time.Duration{0}, want: []outcome{0}, reported: 1},
		{name: "a patch refused, the object gone meanwhile: dropped", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"}}, cached: true,
			report: &report{status: settled, nodeUID: "u1"}, patchRefused: true, listedGone: true, steps: []time.Duration{0}, want: []outcome{otherNode}},
		{name: "the cache lags a Node registered again: kept", node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "new"}},
			report: &report{status: settled, nodeUID: "new"}, steps: []time.Duration{0}, want: []outcome{notCached}, reported: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.node != nil {
				client = fake.NewClientset(tc.node)
			}
			if tc.patchRefused {
				client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), "n1", errors.New("Precondition failed: UID in precondition: u1, UID in object meta: u2"))
				})
			}
			if tc.listedGone {
				client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, &corev1.NodeList{}, nil
				})
			}
			var lister corelisters.NodeLister = emptyLister{}
			if tc.cached {
				lister = freshLister{client}
			}
			clk := clocktesting.NewFakeClock(fakeStart)
			w := New(Config{Log: zap.NewNop(), Client: client, Nodes: lister, Table: assignment.NewTable(nil),
				Metrics: NewMetrics(prometheus.NewRegistry()), Clock: clk, RestartingDelay: 10 * time.Second})
			if tc.report != nil {
				w.state["n1"] = &nodeState{report: tc.report}
			}
			for i, step := range tc.steps {
				clk.Step(step)
				got, err := w.write(context.Background(), "n1")
				if (err != nil) != (tc.want[i] == 0) {
					t.Fatalf("write %d: %v %v, want %v", i+1, got, err, tc.want[i])
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
