package queuemetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/util/workqueue"
)

// TestQueueReportsThroughProvider drives a real workqueue and reads its metrics back from the registry,
// per queue name: two queues share one provider, as dkc-server's node and status queues do.
func TestQueueReportsThroughProvider(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	p := New(reg)
	// An hour's backoff: the retried item stays out of the queue while the test reads the depth.
	nodes := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Hour, time.Hour),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodes", MetricsProvider: p})
	defer nodes.ShutDown()
	status := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodestatus", MetricsProvider: p})
	defer status.ShutDown()

	nodes.Add("node-1")
	nodes.Add("node-1") // already waiting: neither queued nor counted again
	nodes.Add("node-2")
	status.Add("node-1")
	item, _ := nodes.Get()
	nodes.Done(item)
	nodes.AddRateLimited("node-3")

	want := `
# HELP workqueue_adds_total Items added to the workqueue (adding an item that is already waiting changes nothing).
# TYPE workqueue_adds_total counter
workqueue_adds_total{name="nodes"} 2
workqueue_adds_total{name="nodestatus"} 1
# HELP workqueue_depth Current depth of the workqueue: items waiting for a worker.
# TYPE workqueue_depth gauge
workqueue_depth{name="nodes"} 1
workqueue_depth{name="nodestatus"} 1
# HELP workqueue_retries_total Items put back with rate limiting after a failed attempt.
# TYPE workqueue_retries_total counter
workqueue_retries_total{name="nodes"} 1
workqueue_retries_total{name="nodestatus"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"workqueue_adds_total", "workqueue_depth", "workqueue_retries_total"); err != nil {
		t.Error(err)
	}
	// One item taken (queue_duration) and one finished (work_duration), on the nodes queue only.
	for _, name := range []string{"workqueue_queue_duration_seconds", "workqueue_work_duration_seconds"} {
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
		if got["nodes"] != 1 || got["nodestatus"] != 0 {
			t.Errorf("%s sample counts = %v, want nodes 1 and nodestatus 0", name, got)
		}
	}
}
