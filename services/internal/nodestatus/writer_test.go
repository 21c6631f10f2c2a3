// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// freshLister reads Nodes straight from the clientset: these tests are about what is written, not about
// a lagging cache.
type freshLister struct{ client kubernetes.Interface }

func (l freshLister) List(labels.Selector) ([]*corev1.Node, error) {
	list, err := l.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	nodes := make([]*corev1.Node, len(list.Items))
	for i := range list.Items {
		nodes[i] = &list.Items[i]
	}
	return nodes, nil
}

func (l freshLister) Get(name string) (*corev1.Node, error) {
	return l.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
}

var _ corelisters.NodeLister = freshLister{}

func newWriter(t *testing.T, client *fake.Clientset) (*Writer, *Metrics) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	return New(Config{Log: zap.NewNop(), Client: client, Nodes: freshLister{client}, Table: assignment.NewTable(nil), Metrics: m}), m
}

func getNode(t *testing.T, client kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func annotationOf(t *testing.T, n *corev1.Node) corev1.NodeConfigStatus {
	t.Helper()
	var st corev1.NodeConfigStatus
	if err := json.Unmarshal([]byte(n.Annotations[nodeconfig.StatusAnnotation]), &st); err != nil {
		t.Fatalf("status annotation %q: %v", n.Annotations[nodeconfig.StatusAnnotation], err)
	}
	return st
}

func statusJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestStatusConfigFollowsEveryStep: on a Node that keeps status.config (an apiserver ≤ 1.23, or a Node
// upgraded from one), each report leaves status.config exactly equal to it — fields the node stopped
// reporting are removed — and a report of what the Node already shows writes nothing.
func TestStatusConfigFollowsEveryStep(t *testing.T) {
	const name = "n1"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Config: &corev1.NodeConfigStatus{}}})
	w, m := newWriter(t, client)
	good, bad := cm("1"), cm("2")
	observed := time.Now()
	for _, step := range []struct {
		name string
		want corev1.NodeConfigStatus
	}{
		{"assigned", corev1.NodeConfigStatus{Assigned: good, Active: good, LastKnownGood: good}},
		{"error set", corev1.NodeConfigStatus{Assigned: bad, Active: good, LastKnownGood: good, Error: "failed to validate config, see Kubelet log for details"}},
		{"error cleared", corev1.NodeConfigStatus{Assigned: good, Active: good, LastKnownGood: good}},
		{"last-known-good forgotten", corev1.NodeConfigStatus{Assigned: good, Active: good}},
		{"reset", corev1.NodeConfigStatus{}},
	} {
		t.Run(step.name, func(t *testing.T) {
			report := func() {
				t.Helper()
				observed = observed.Add(time.Second)
				if _, err := w.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name,
					Status: wire.StatusFromCore(&step.want), ObservedTime: timestamppb.New(observed)}); err != nil {
					t.Fatalf("Report: %v", err)
				}
			}
			report()
			n := getNode(t, client, name)
			if n.Status.Config == nil || !apiequality.Semantic.DeepEqual(*n.Status.Config, step.want) {
				t.Errorf("status.config = %s\nwant %s", statusJSON(n.Status.Config), statusJSON(step.want))
			}
			if got := annotationOf(t, n); !apiequality.Semantic.DeepEqual(got, step.want) {
				t.Errorf("annotation = %s\nwant %s", statusJSON(got), statusJSON(step.want))
			}
			before := testutil.ToFloat64(m.writes.WithLabelValues("written"))
			report()
			if n := testutil.ToFloat64(m.writes.WithLabelValues("written")) - before; n != 0 {
				t.Errorf("the same status reported again was written %v more times", n)
			}
		})
	}
}

// TestTransientEventFailureIsRetried: an Event that failed for a reason that may pass (a server error) is
// not dropped: the status is written all the same, the report fails so the sidecar sends it again, and the
// retry creates the Event once.
func TestTransientEventFailureIsRetried(t *testing.T) {
	const name = "n1"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	failures := 1
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures > 0 {
			failures--
			return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
		}
		return false, nil, nil
	})
	w, _ := newWriter(t, client)
	st := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}
	req := &dkcv1.ReportStatusRequest{NodeName: name, Status: wire.StatusFromCore(&st), Incarnation: 1, Sequence: 1,
		Restart: &dkcv1.KubeletRestart{Id: "r1", Target: wire.SourceFromCore(cm("1")), Time: timestamppb.Now()}}
	if _, err := w.Report(context.Background(), name, req); err == nil {
		t.Fatal("report acknowledged although its Event was not created and could be")
	}
	if got := annotationOf(t, getNode(t, client, name)); !apiequality.Semantic.DeepEqual(got, st) {
		t.Fatalf("status not written with the event failing: %s", statusJSON(got))
	}
	if _, err := w.Report(context.Background(), name, req); err != nil {
		t.Fatalf("the retried report: %v", err)
	}
	events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 1 {
		t.Errorf("%d events after the retry, want 1", len(events.Items))
	}
}

// TestRefusedEventDoesNotHoldBackStatus: an Event the apiserver refuses (quota, admission policy) is
// logged, counted and dropped; the report is still written and acknowledged, and later reports — still
// carrying the restart, as a sidecar's retries do — advance the node's status.
func TestRefusedEventDoesNotHoldBackStatus(t *testing.T) {
	for _, tc := range []struct {
		name        string
		refuse      bool
		wantEvents  int
		wantCounted map[string]float64
	}{
		{"events refused", true, 0, map[string]float64{"error": 2, "created": 0}},
		{"events accepted", false, 1, map[string]float64{"error": 0, "created": 1, "duplicate": 0, "known": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const name = "n1"
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			if tc.refuse {
				client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "",
						apierrors.NewBadRequest(`exceeded quota: events, requested: count/events=1`))
				})
			}
			w, m := newWriter(t, client)
			restart := &dkcv1.KubeletRestart{Id: "r1", Target: wire.SourceFromCore(cm("1")), Time: timestamppb.Now()}
			t0 := time.Now()
			for i, st := range []corev1.NodeConfigStatus{
				{Assigned: cm("1")},
				{Assigned: cm("1"), Active: cm("1")},
			} {
				_, err := w.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name,
					Status: wire.StatusFromCore(&st), Restart: restart, ObservedTime: timestamppb.New(t0.Add(time.Duration(i) * time.Second))})
				if err != nil {
					t.Fatalf("report %d: %v", i, err)
				}
				if got := annotationOf(t, getNode(t, client, name)); !apiequality.Semantic.DeepEqual(got, st) {
					t.Fatalf("report %d: annotation = %s, want %s", i, statusJSON(got), statusJSON(st))
				}
			}
			events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(events.Items) != tc.wantEvents {
				t.Errorf("%d events, want %d", len(events.Items), tc.wantEvents)
			}
			for result, want := range tc.wantCounted {
				if got := testutil.ToFloat64(m.events.WithLabelValues(result)); got != want {
					t.Errorf("restart_events_total{result=%q} = %v, want %v", result, got, want)
				}
			}
		})
	}
}

// TestReportsOrderedByIncarnationAndSequence: a node's reports are ordered by its sidecar's incarnation and
// sequence, not by the observed time its clock stamps on them: after the node's clock steps back, newer
// reports are still written, and a late copy of an older report is still ignored, whatever its time says.
func TestReportsOrderedByIncarnationAndSequence(t *testing.T) {
	const name = "n1"
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		reports []*dkcv1.ReportStatusRequest // in arrival order; Status.Error names each
		want    string                       // the error on the Node at the end
		stale   []bool                       // Report returned ErrStale
	}{
		{"clock steps back between reports", []*dkcv1.ReportStatusRequest{
			{Incarnation: 5, Sequence: 1, ObservedTime: timestamppb.New(t0), Status: &dkcv1.NodeConfigStatus{Error: "first"}},
			{Incarnation: 5, Sequence: 2, ObservedTime: timestamppb.New(t0.Add(-time.Hour)), Status: &dkcv1.NodeConfigStatus{Error: "second"}},
		}, "second", []bool{false, false}},
		{"sidecar restarted with its clock behind", []*dkcv1.ReportStatusRequest{
			{Incarnation: 5, Sequence: 9, ObservedTime: timestamppb.New(t0), Status: &dkcv1.NodeConfigStatus{Error: "old sidecar"}},
			{Incarnation: 6, Sequence: 1, ObservedTime: timestamppb.New(t0.Add(-time.Hour)), Status: &dkcv1.NodeConfigStatus{Error: "new sidecar"}},
		}, "new sidecar", []bool{false, false}},
		{"late copy of an older report with a later time", []*dkcv1.ReportStatusRequest{
			{Incarnation: 5, Sequence: 2, ObservedTime: timestamppb.New(t0), Status: &dkcv1.NodeConfigStatus{Error: "newer"}},
			{Incarnation: 5, Sequence: 1, ObservedTime: timestamppb.New(t0.Add(time.Hour)), Status: &dkcv1.NodeConfigStatus{Error: "older"}},
		}, "newer", []bool{false, true}},
		{"the same report again", []*dkcv1.ReportStatusRequest{
			{Incarnation: 5, Sequence: 2, ObservedTime: timestamppb.New(t0), Status: &dkcv1.NodeConfigStatus{Error: "once"}},
			{Incarnation: 5, Sequence: 2, ObservedTime: timestamppb.New(t0.Add(-time.Second)), Status: &dkcv1.NodeConfigStatus{Error: "once"}},
		}, "once", []bool{false, false}},
		{"older sidecars: observed time", []*dkcv1.ReportStatusRequest{
			{ObservedTime: timestamppb.New(t0), Status: &dkcv1.NodeConfigStatus{Error: "later"}},
			{ObservedTime: timestamppb.New(t0.Add(-time.Second)), Status: &dkcv1.NodeConfigStatus{Error: "earlier"}},
		}, "later", []bool{false, true}},
		{"upgraded sidecar", []*dkcv1.ReportStatusRequest{
			{ObservedTime: timestamppb.New(t0), Status: &dkcv1.NodeConfigStatus{Error: "unnumbered"}},
			{Incarnation: 1, Sequence: 1, ObservedTime: timestamppb.New(t0.Add(-time.Hour)), Status: &dkcv1.NodeConfigStatus{Error: "numbered"}},
		}, "numbered", []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			w, _ := newWriter(t, client)
			for i, r := range tc.reports {
				r.NodeName = name
				_, err := w.Report(context.Background(), name, r)
				if stale := errors.Is(err, ErrStale); stale != tc.stale[i] || (err != nil && !stale) {
					t.Fatalf("report %d (%q): %v; want stale=%v", i, r.GetStatus().GetError(), err, tc.stale[i])
				}
			}
			if got := annotationOf(t, getNode(t, client, name)).Error; got != tc.want {
				t.Errorf("the Node shows %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReplicaThatNoLongerServesANodeWritesNothingOld: node n1 reported to replica A, then moved to replica
// B (--max-connection-age, a pod deletion) and reported a newer status there. A sync-error change re-queues
// n1 on both replicas; A must not write its older report back over B's, and drops it.
func TestReplicaThatNoLongerServesANodeWritesNothingOld(t *testing.T) {
	const name = "n1"
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	var mu sync.Mutex
	servedBy := "a"
	serving := func(replica string) func(string) bool {
		return func(string) bool { mu.Lock(); defer mu.Unlock(); return servedBy == replica }
	}
	m := NewMetrics(prometheus.NewRegistry())
	tableA, tableB := assignment.NewTable(nil), assignment.NewTable(nil)
	a := New(Config{Log: zap.NewNop(), Client: client, Nodes: freshLister{client}, Table: tableA, Metrics: m, Serving: serving("a")})
	b := New(Config{Log: zap.NewNop(), Client: client, Nodes: freshLister{client}, Table: tableB, Metrics: NewMetrics(prometheus.NewRegistry()), Serving: serving("b")})
	old := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}
	newer := corev1.NodeConfigStatus{Assigned: cm("2"), Active: cm("2")}
	if _, err := a.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name, Status: wire.StatusFromCore(&old), Incarnation: 1, Sequence: 1}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	servedBy = "b"
	mu.Unlock()
	if _, err := b.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name, Status: wire.StatusFromCore(&newer), Incarnation: 1, Sequence: 2}); err != nil {
		t.Fatal(err)
	}
	// The node's sync error changed: both replicas' tables re-queue it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.Run(ctx, 1, time.Second) }()
	a.Enqueue(name)
	poll.Until(t, "replica A to drop the report of a node it no longer serves", func() bool { return a.Reported() == 0 })
	if got := annotationOf(t, getNode(t, client, name)); !apiequality.Semantic.DeepEqual(got, newer) {
		t.Fatalf("the Node shows %s, want B's newer %s", statusJSON(got), statusJSON(newer))
	}
	if testutil.ToFloat64(m.writes.WithLabelValues("written")) != 1 {
		t.Errorf("replica A wrote %v times, want once (its own report, while it served the node)", testutil.ToFloat64(m.writes.WithLabelValues("written")))
	}
}

// staleLister serves the Node as it was when the test began: the informer cache has not seen any patch yet.
type staleLister struct {
	corelisters.NodeLister
	node *corev1.Node
}

func (l staleLister) Get(string) (*corev1.Node, error) { return l.node.DeepCopy(), nil }

// TestLaggingCacheCostsNoSecondPatch: a report written, then the same status asked for again before the
// cache shows the first patch (a queued write right behind a report, a retried report), patches once; a
// different status is still written at once, and the last one is never skipped.
func TestLaggingCacheCostsNoSecondPatch(t *testing.T) {
	const name = "n1"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "7"}}
	client := fake.NewClientset(node)
	m := NewMetrics(prometheus.NewRegistry())
	w := New(Config{Log: zap.NewNop(), Client: client, Nodes: staleLister{node: node}, Table: assignment.NewTable(nil), Metrics: m})
	patches := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" {
				n++
			}
		}
		return n
	}
	observed := time.Now()
	report := func(st corev1.NodeConfigStatus) {
		t.Helper()
		observed = observed.Add(time.Second)
		if _, err := w.Report(context.Background(), name, &dkcv1.ReportStatusRequest{NodeName: name,
			Status: wire.StatusFromCore(&st), ObservedTime: timestamppb.New(observed)}); err != nil {
			t.Fatalf("Report: %v", err)
		}
	}
	first := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}
	report(first)
	report(first)
	if _, err := w.write(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	if got := patches(); got != 1 {
		t.Fatalf("%d patches for one status over a cache that lags, want 1", got)
	}
	report(corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1"), LastKnownGood: cm("1")})
	if got := patches(); got != 2 {
		t.Fatalf("%d patches after a new status, want 2", got)
	}
	if got := annotationOf(t, getNode(t, client, name)); got.LastKnownGood == nil {
		t.Fatalf("the new status is not on the Node: %+v", got)
	}
}

// TestRestartInProgressWaitsForItsOutcome: a report of a restart in progress ("assigned, not yet running")
// is acknowledged and held for RestartingDelay; the outcome reported within it is the only write, and a
// restart that takes longer is written when the delay has passed. A status with an error is never held.
// The delay runs on a fake clock, and the test works the queue as Run's workers do.
func TestRestartInProgressWaitsForItsOutcome(t *testing.T) {
	const (
		name  = "n1"
		delay = 10 * time.Second
	)
	running := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1"), LastKnownGood: cm("1")}
	restartingTo2 := corev1.NodeConfigStatus{Assigned: cm("2"), Active: cm("1"), LastKnownGood: cm("1")}
	resetting := corev1.NodeConfigStatus{Active: cm("1"), LastKnownGood: cm("1")}
	runs2 := corev1.NodeConfigStatus{Assigned: cm("2"), Active: cm("2"), LastKnownGood: cm("1")}
	refused := corev1.NodeConfigStatus{Assigned: cm("2"), Active: cm("1"), LastKnownGood: cm("1"), Error: string(nodeconfig.ValidateError)}
	for _, tc := range []struct {
		name string
		// reports after running, each after the pause before it
		reports []corev1.NodeConfigStatus
		pauses  []time.Duration
		// shown: what the Node shows right after the last report; final: after the delay; writes: patches
		// after running
		shown, final corev1.NodeConfigStatus
		writes       float64
	}{
		{"outcome within the delay", []corev1.NodeConfigStatus{restartingTo2, runs2}, []time.Duration{0, delay / 4},
			runs2, runs2, 1},
		{"restart slower than the delay", []corev1.NodeConfigStatus{restartingTo2}, []time.Duration{0},
			running, restartingTo2, 1},
		{"reset to the local config", []corev1.NodeConfigStatus{resetting}, []time.Duration{0},
			running, resetting, 1},
		{"held from the first report of a restart", []corev1.NodeConfigStatus{restartingTo2, resetting}, []time.Duration{0, 3 * delay / 4},
			running, resetting, 1},
		{"an error is written at once", []corev1.NodeConfigStatus{refused}, []time.Duration{0},
			refused, refused, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			m := NewMetrics(prometheus.NewRegistry())
			clk := clocktesting.NewFakeClock(fakeStart)
			w := New(Config{Log: zap.NewNop(), Client: client, Nodes: freshLister{client}, Table: assignment.NewTable(nil), Metrics: m,
				RestartingDelay: delay, Clock: clk})
			t.Cleanup(w.queue.ShutDown)
			ctx := context.Background()
			var seq uint64
			report := func(st corev1.NodeConfigStatus) {
				t.Helper()
				seq++
				if _, err := w.Report(ctx, name, &dkcv1.ReportStatusRequest{NodeName: name, Status: wire.StatusFromCore(&st), Incarnation: 1, Sequence: seq}); err != nil {
					t.Fatalf("Report: %v", err)
				}
			}
			report(running)
			base := testutil.ToFloat64(m.writes.WithLabelValues("written"))
			for i, st := range tc.reports {
				clk.Step(tc.pauses[i])
				report(st)
			}
			if got := annotationOf(t, getNode(t, client, name)); !apiequality.Semantic.DeepEqual(got, tc.shown) {
				t.Errorf("right after the reports the Node shows %s, want %s", statusJSON(got), statusJSON(tc.shown))
			}
			// Each held report queued the node again for the end of its hold, the delay after the restart's
			// first report (at fakeStart). The delaying queue's goroutine hands it out once the clock gets
			// there; a jump that falls between its reading of the clock and its setting of the timer makes
			// the timer late by up to the jump, hence the small steps after it, and the slack.
			clk.SetTime(fakeStart.Add(delay))
			if testutil.ToFloat64(m.writes.WithLabelValues("held")) > 0 {
				poll.Stepping(t, "the held report's node to be queued again", clk, time.Millisecond, func() bool { return w.queue.Len() > 0 })
				if late := clk.Since(fakeStart) - delay; late > delay/2 {
					t.Errorf("the held report's node was queued again %v after the delay", late)
				}
			}
			for w.queue.Len() > 0 {
				w.processNext(ctx)
			}
			if got := annotationOf(t, getNode(t, client, name)); !apiequality.Semantic.DeepEqual(got, tc.final) {
				t.Errorf("after the delay the Node shows %s, want %s", statusJSON(got), statusJSON(tc.final))
			}
			if got := testutil.ToFloat64(m.writes.WithLabelValues("written")) - base; got != tc.writes {
				t.Errorf("%v writes after the running status, want %v", got, tc.writes)
			}
		})
	}
}

// TestEventRefused: a refusal for good drops a restart's Event; a starting apiserver's NamespaceLifecycle
// 403 ("not yet ready to handle request") is over in seconds, so the Event is retried, not dropped.
func TestEventRefused(t *testing.T) {
	events := schema.GroupResource{Resource: "events"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"quota", apierrors.NewForbidden(events, "node-1.r1", errors.New(`exceeded quota: events, requested: count/events=1`)), true},
		{"a starting apiserver's namespace lifecycle", apierrors.NewForbidden(events, "node-1.r1", errors.New("not yet ready to handle request")), false},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Kind: "Event"}, "node-1.r1", nil), true},
		{"throttled", apierrors.NewTooManyRequests("slow down", 1), false},
		{"server error", apierrors.NewInternalError(errors.New("etcd")), false},
		{"the connection", errors.New("connection refused"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := eventRefused(tc.err); got != tc.want {
				t.Errorf("eventRefused(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
