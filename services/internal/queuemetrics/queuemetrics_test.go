// SPDX-License-Identifier: Apache-2.0

package queuemetrics

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/util/workqueue"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/poll"
)

// TestQueueReportsThroughProvider drives a real workqueue and reads its metrics back from the registry,
// per queue name: two queues share one provider, as dkc-server's node and status queues do.
func TestQueueReportsThroughProvider(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	p := New(reg)
	clock := testingclock.NewFakeClock(time.Now())
	// An hour's backoff: the retried item stays out of the queue while the test reads the depth.
	nodes := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Hour, time.Hour),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodes", MetricsProvider: p, Clock: clock})
	defer nodes.ShutDown()
	status := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodestatus", MetricsProvider: p, Clock: clock})
	defer status.ShutDown()

	nodes.Add("node-1")
	nodes.Add("node-1") // already waiting: neither queued nor counted again
	nodes.Add("node-2")
	status.Add("node-1")
	status.Add("node-2")
	item, _ := nodes.Get()
	nodes.Done(item)
	nodes.AddRateLimited("node-3")
	held, _ := status.Get() // taken and not done: queued once, never finished
	defer status.Done(held)

	want := `
# HELP workqueue_adds_total Items added to the workqueue (adding an item that is already waiting changes nothing).
# TYPE workqueue_adds_total counter
workqueue_adds_total{name="nodes"} 2
workqueue_adds_total{name="nodestatus"} 2
# HELP workqueue_depth Current depth of the workqueue: items waiting for a worker (also one added again while a worker has it).
# TYPE workqueue_depth gauge
workqueue_depth{name="nodes"} 1
workqueue_depth{name="nodestatus"} 1
# HELP workqueue_retries_total Items re-queued with a delay: retries after a failed attempt, and the status writer's hold of a restart in progress.
# TYPE workqueue_retries_total counter
workqueue_retries_total{name="nodes"} 1
workqueue_retries_total{name="nodestatus"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"workqueue_adds_total", "workqueue_depth", "workqueue_retries_total"); err != nil {
		t.Error(err)
	}
	// Each queue has had one item taken (queue_duration); only the nodes queue's was finished (work_duration).
	for name, want := range map[string]map[string]uint64{
		"workqueue_queue_duration_seconds": {"nodes": 1, "nodestatus": 1},
		"workqueue_work_duration_seconds":  {"nodes": 1, "nodestatus": 0},
	} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s sample counts = %v, want %v", name, got, want)
		}
	}

	// The held item's time in a worker shows in the two gauges the queue updates every 500 ms (its clock's).
	poll.Stepping(t, "unfinished_work_seconds and longest_running_processor_seconds of at least 2s", clock, time.Second, func() bool {
		return testutil.ToFloat64(p.unfinished.WithLabelValues("nodestatus")) >= 2 && testutil.ToFloat64(p.longest.WithLabelValues("nodestatus")) >= 2
	})
}
