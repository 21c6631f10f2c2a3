// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"
	"errors"
	"fmt"
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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/nodeconfig/wire"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// TestReportsPastTheInlineBoundAreQueued: with MaxInlineWrites writes waiting on the apiserver, a further
// report is acknowledged at once without a call to the apiserver, and the queue then writes it and creates
// its restart's Event, also after a transient Event failure. When the node's stream has left this replica
// meanwhile, the Events are still created (acknowledged) but the status is not written here: the node
// sends it again to the replica it streams from, which may already have written a newer one. Several reports of a node queued together cost one write.
func TestReportsPastTheInlineBoundAreQueued(t *testing.T) {
	for _, tc := range []struct {
		name          string
		serving       bool
		eventFailures int
	}{
		{"served here", true, 0},
		{"stream moved after the acknowledgement: events only", false, 0},
		{"event failing once", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(
				&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "slow"}},
				&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			unblock := make(chan struct{})
			blocked := make(chan struct{})
			var evMu sync.Mutex
			failures := tc.eventFailures
			client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
				evMu.Lock()
				defer evMu.Unlock()
				if failures > 0 {
					failures--
					return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
				}
				return false, nil, nil
			})
			m := NewMetrics(prometheus.NewRegistry())
			slow := &slowClient{Clientset: client, name: "slow", blocked: blocked, unblock: unblock}
			w := New(Config{Log: zap.NewNop(), Client: slow, Nodes: freshLister{client}, Table: assignment.NewTable(nil), Metrics: m,
				MaxInlineWrites: 1, Serving: func(string) bool { return tc.serving }})
			st := func(rv string) *dkcv1.NodeConfigStatus {
				s := corev1.NodeConfigStatus{Assigned: cm(rv), Active: cm(rv)}
				return wire.StatusFromCore(&s)
			}
			slowDone := make(chan error, 1)
			go func() {
				_, err := w.Report(context.Background(), "slow", &dkcv1.ReportStatusRequest{NodeName: "slow", Status: st("1"), Incarnation: 1, Sequence: 1})
				slowDone <- err
			}()
			<-blocked
			// The one inline write is taken: these are acknowledged as queued, the second replacing the first.
			for seq, rv := range []string{"1", "2"} {
				req := &dkcv1.ReportStatusRequest{NodeName: "n1", Status: st(rv), Incarnation: 1, Sequence: uint64(seq + 1),
					Restart: &dkcv1.KubeletRestart{Id: "r" + rv, Target: wire.SourceFromCore(cm(rv)), Time: timestamppb.Now()}}
				if _, err := w.Report(context.Background(), "n1", req); err != nil {
					t.Fatalf("report %d past the bound: %v", seq+1, err)
				}
			}
			if got := testutil.ToFloat64(m.writes.WithLabelValues("queued")); got != 2 {
				t.Errorf("queued reports = %v, want 2", got)
			}
			if n := getNode(t, client, "n1"); n.Annotations != nil {
				t.Fatalf("a queued report was written inline: %v", n.Annotations)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = w.Run(ctx, 1, time.Second) }()
			want := corev1.NodeConfigStatus{Assigned: cm("2"), Active: cm("2")}
			statusDone := func(n *corev1.Node) bool {
				if !tc.serving {
					return n.Annotations == nil
				}
				return n.Annotations != nil && apiequality.Semantic.DeepEqual(annotationOf(t, n), want)
			}
			poll.UntilNil(t, "the queue to write the acknowledged report and its 2 events", func() error {
				events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				// Owed no more: the write returned (the Node shows a patch a moment before).
				if n := getNode(t, client, "n1"); !statusDone(n) || len(events.Items) != 2 || (tc.serving && w.owed("n1")) {
					return fmt.Errorf("annotations %v, %d events", n.Annotations, len(events.Items))
				}
				return nil
			})
			close(unblock)
			if err := <-slowDone; err != nil {
				t.Fatalf("inline report: %v", err)
			}
			wantWrites := 2.0
			if !tc.serving {
				wantWrites = 1 // the slow node's only
			}
			if got := testutil.ToFloat64(m.writes.WithLabelValues("written")); got != wantWrites {
				t.Errorf("writes = %v, want %v: the slow node's and, served here, one for n1's two queued reports", got, wantWrites)
			}
		})
	}
}

// slowClient is a clientset whose status patches of Node name wait until unblock is closed (an apiserver
// that takes its time), closing blocked when the first one starts. It wraps the fake clientset rather than
// waiting in a reactor: the fake holds its lock while a reactor runs, which would stop every other call.
type slowClient struct {
	*fake.Clientset
	name             string
	once             sync.Once
	blocked, unblock chan struct{}
}

func (c *slowClient) CoreV1() corev1client.CoreV1Interface { return slowCore{c.Clientset.CoreV1(), c} }

type slowCore struct {
	corev1client.CoreV1Interface
	c *slowClient
}

func (s slowCore) Nodes() corev1client.NodeInterface {
	return slowNodes{s.CoreV1Interface.Nodes(), s.c}
}

type slowNodes struct {
	corev1client.NodeInterface
	c *slowClient
}

func (n slowNodes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*corev1.Node, error) {
	if name == n.c.name {
		n.c.once.Do(func() { close(n.c.blocked) })
		<-n.c.unblock
	}
	return n.NodeInterface.Patch(ctx, name, pt, data, opts, sub...)
}

// TestShutdownDrainsQueuedReports: when Run's context ends (a rolling update), what was acknowledged as
// queued is still written, Events included, and a report that arrives while the server lets its calls
// finish is written before it is acknowledged, even past MaxInlineWrites.
func TestShutdownDrainsQueuedReports(t *testing.T) {
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "slow"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}})
	unblock := make(chan struct{})
	blocked := make(chan struct{})
	slow := &slowClient{Clientset: client, name: "slow", blocked: blocked, unblock: unblock}
	w := New(Config{Log: zap.NewNop(), Client: slow, Nodes: freshLister{client}, Table: assignment.NewTable(nil),
		Metrics: NewMetrics(prometheus.NewRegistry()), MaxInlineWrites: 1, Serving: func(string) bool { return true }})
	st := func(rv string) *dkcv1.NodeConfigStatus {
		s := corev1.NodeConfigStatus{Assigned: cm(rv), Active: cm(rv)}
		return wire.StatusFromCore(&s)
	}
	slowDone := make(chan error, 1)
	go func() {
		_, err := w.Report(context.Background(), "slow", &dkcv1.ReportStatusRequest{NodeName: "slow", Status: st("1"), Incarnation: 1, Sequence: 1})
		slowDone <- err
	}()
	<-blocked
	defer func() {
		close(unblock)
		if err := <-slowDone; err != nil {
			t.Errorf("inline report: %v", err)
		}
	}()
	req := &dkcv1.ReportStatusRequest{NodeName: "n1", Status: st("1"), Incarnation: 1, Sequence: 1,
		Restart: &dkcv1.KubeletRestart{Id: "r1", Target: wire.SourceFromCore(cm("1")), Time: timestamppb.Now()}}
	receipt, err := w.Report(context.Background(), "n1", req)
	if err != nil {
		t.Fatalf("report past the bound: %v", err)
	}
	if !receipt.EventQueued {
		t.Errorf("a report queued with its restart: EventQueued false, want true (the sidecar keeps the restart)")
	}
	if n := getNode(t, client, "n1"); n.Annotations != nil {
		t.Fatalf("a queued report was written inline: %v", n.Annotations)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the replica is stopping before its queue ran at all
	if err := w.Run(ctx, 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	want := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}
	if n := getNode(t, client, "n1"); n.Annotations == nil || !apiequality.Semantic.DeepEqual(annotationOf(t, n), want) {
		t.Errorf("the report acknowledged as queued was not written by the drain: %v", n.Annotations)
	}
	events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 1 {
		t.Errorf("%d events after the drain, want the queued restart's 1", len(events.Items))
	}
	// Draining: the inline write is still taken by "slow", yet this report is written before it returns,
	// its Event too.
	receipt, err = w.Report(context.Background(), "n2", &dkcv1.ReportStatusRequest{NodeName: "n2", Status: st("2"), Incarnation: 1, Sequence: 1,
		Restart: &dkcv1.KubeletRestart{Id: "r2", Target: wire.SourceFromCore(cm("2")), Time: timestamppb.Now()}})
	if err != nil {
		t.Fatalf("report while draining: %v", err)
	}
	if receipt.EventQueued {
		t.Errorf("a report written inline with its restart: EventQueued true, want false")
	}
	if n := getNode(t, client, "n2"); n.Annotations == nil {
		t.Errorf("a report acknowledged while draining is not on the Node")
	}
}

// queuedFailingEvent is a writer on clk holding node n1's queued report and its restart's Event, which the
// apiserver keeps failing transiently; n1 is in the queue.
func queuedFailingEvent(clk *clocktesting.FakeClock) (*fake.Clientset, *Writer) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(errors.New("etcd is slow"))
	})
	w := New(Config{Log: zap.NewNop(), Client: client, Nodes: freshLister{client}, Table: assignment.NewTable(nil),
		Metrics: NewMetrics(prometheus.NewRegistry()), Serving: func(string) bool { return true }, Clock: clk})
	w.mu.Lock()
	w.stateLocked("n1").report = &report{status: &dkcv1.NodeConfigStatus{}, order: reportOrder{incarnation: 1, sequence: 1}, seq: 1, owed: true}
	w.addEventLocked("n1", &dkcv1.KubeletRestart{Id: "r1", Target: wire.SourceFromCore(cm("1")), Time: timestamppb.New(w.clock.Now())})
	w.mu.Unlock()
	w.queue.Add("n1")
	return client, w
}

// TestEventRetryBacksOff: a queued restart whose Event the apiserver keeps failing (transiently) is retried
// with a growing backoff, also when the node's status was written meanwhile.
func TestEventRetryBacksOff(t *testing.T) {
	clk := clocktesting.NewFakeClock(fakeStart)
	client, w := queuedFailingEvent(clk)
	for i := 1; i <= 3; i++ {
		if !w.processNext(context.Background()) {
			t.Fatal("queue shut down")
		}
		if got := w.queue.NumRequeues("n1"); got != i {
			t.Fatalf("after %d failed Event creations the node was requeued %d times with backoff, want %d", i, got, i)
		}
		// The rate-limited re-add: 200ms, 400ms, 800ms with NewPending's limiter, on the fake clock.
		poll.Stepping(t, "the node to be queued again", clk, 100*time.Millisecond, func() bool { return w.queue.Len() > 0 })
	}
	if n := getNode(t, client, "n1"); n.Annotations == nil {
		t.Errorf("the status was not written while its Event failed")
	}
}

// TestQueuedEventGivenUpAfterAnHour: a queued Event that keeps failing is dropped once its restart is an
// hour old (its Event would have expired), and the node leaves the queue's backoff.
func TestQueuedEventGivenUpAfterAnHour(t *testing.T) {
	clk := clocktesting.NewFakeClock(fakeStart)
	_, w := queuedFailingEvent(clk)
	w.processNext(context.Background())
	if got := w.queue.NumRequeues("n1"); got != 1 {
		t.Fatalf("a fresh failing Event: %d requeues, want 1", got)
	}
	clk.Step(eventGiveUp + time.Second)
	poll.Stepping(t, "the rate-limited re-add", clk, time.Second, func() bool { return w.queue.Len() > 0 })
	w.processNext(context.Background())
	if got := w.queue.NumRequeues("n1"); got != 0 {
		t.Errorf("an Event failing for an hour: still %d requeues, want it dropped and the node forgotten", got)
	}
	w.mu.Lock()
	left := 0
	if s := w.state["n1"]; s != nil {
		left = len(s.events)
	}
	w.mu.Unlock()
	if left != 0 {
		t.Errorf("%d events still queued, want 0", left)
	}
}

// TestConfirmedRestartAsksNothingAgain: a restart acknowledged as queued comes back when its sidecar
// confirms it (outbox.Confirm) or retries the report. Once this replica has created its Event, it is
// acknowledged as recorded — on the queued path (the sidecar then stops carrying it) and inline — without
// another create.
func TestConfirmedRestartAsksNothingAgain(t *testing.T) {
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "slow"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	var creates int
	var mu sync.Mutex
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		creates++
		mu.Unlock()
		return false, nil, nil
	})
	unblock, blocked := make(chan struct{}), make(chan struct{})
	slow := &slowClient{Clientset: client, name: "slow", blocked: blocked, unblock: unblock}
	m := NewMetrics(prometheus.NewRegistry())
	w := New(Config{Log: zap.NewNop(), Client: slow, Nodes: freshLister{client}, Table: assignment.NewTable(nil),
		Metrics: m, MaxInlineWrites: 1, Serving: func(string) bool { return true }})
	s := corev1.NodeConfigStatus{Assigned: cm("1"), Active: cm("1")}
	slowDone := make(chan error, 1)
	go func() {
		_, err := w.Report(context.Background(), "slow", &dkcv1.ReportStatusRequest{NodeName: "slow",
			Status: wire.StatusFromCore(&s), Incarnation: 1, Sequence: 1})
		slowDone <- err
	}()
	<-blocked
	req := &dkcv1.ReportStatusRequest{NodeName: "n1", Status: wire.StatusFromCore(&s), Incarnation: 1, Sequence: 1,
		Restart: &dkcv1.KubeletRestart{Id: "r1", Target: wire.SourceFromCore(cm("1")), Time: timestamppb.Now()}}
	for _, step := range []struct {
		name       string
		queue      bool // run the queue once before the report
		unblock    bool // free the inline write before the report
		wantQueued bool
	}{
		{name: "first report, past the inline bound", wantQueued: true},
		{name: "sent again while queued: still queued, once", wantQueued: true},
		{name: "confirmed after the queue created the Event", queue: true},
		{name: "sent again, written inline", unblock: true},
	} {
		if step.queue && !w.processNext(context.Background()) {
			t.Fatal("queue shut down")
		}
		if step.unblock {
			close(unblock)
			if err := <-slowDone; err != nil {
				t.Fatalf("inline report: %v", err)
			}
		}
		receipt, err := w.Report(context.Background(), "n1", req)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if receipt.EventQueued != step.wantQueued {
			t.Errorf("%s: EventQueued %v, want %v", step.name, receipt.EventQueued, step.wantQueued)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if creates != 1 {
		t.Errorf("%d Event creates for one restart, want 1", creates)
	}
	if got := testutil.ToFloat64(m.events.WithLabelValues("known")); got != 1 {
		t.Errorf("restart_events_total{result=\"known\"} = %v, want 1 (the inline re-send)", got)
	}
}
