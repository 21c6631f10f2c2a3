// SPDX-License-Identifier: Apache-2.0

// Package queuemetrics exports client-go workqueue metrics to a Prometheus registry, under the names and the
// "name" label every Kubernetes controller uses (workqueue_depth{name="nodes"}, ...), so that the dashboards
// and alerts written for kube-controller-manager and controller-runtime apply to dkc-server's queues too.
//
// The provider is given to each queue (workqueue's QueueConfig.MetricsProvider) rather than installed
// process-wide with workqueue.SetProvider: that one can be set once per process, and a process may build
// several servers (tests do), each with its own registry.
package queuemetrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// Provider makes a queue's metrics; the queue's name is their "name" label.
type Provider struct {
	depth        *prometheus.GaugeVec
	adds         *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	workDuration *prometheus.HistogramVec
	unfinished   *prometheus.GaugeVec
	longest      *prometheus.GaugeVec
	retries      *prometheus.CounterVec
}

var _ workqueue.MetricsProvider = (*Provider)(nil)

// buckets reach from 10 µs to ~25 s in steps of 2.5×: a node's wait in the queue is normally well under a
// millisecond, and the interesting cases (a burst of thousands of nodes, a slow apiserver under the status
// writer) are tenths of a second to seconds, which the decade buckets of Kubernetes' own would not tell apart.
var buckets = prometheus.ExponentialBuckets(10e-6, 2.5, 17)

// New registers the workqueue metrics with reg.
func New(reg prometheus.Registerer) *Provider {
	label := []string{"name"}
	p := &Provider{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "depth",
			Help: "Current depth of the workqueue: items waiting for a worker (also one added again while a worker has it)."},
			label),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "adds_total",
			Help: "Items added to the workqueue (adding an item that is already waiting changes nothing)."}, label),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "queue_duration_seconds",
			Help: "How long an item waits in the workqueue before a worker takes it.", Buckets: buckets}, label),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue",
			Name: "work_duration_seconds", Help: "How long a worker takes to process an item.", Buckets: buckets}, label),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "unfinished_work_seconds",
			Help: "Seconds of work in progress not yet observed by work_duration_seconds; a large value means stuck workers."},
			label),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue",
			Name: "longest_running_processor_seconds",
			Help: "How long the longest-running worker has been processing its item."}, label),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "retries_total",
			Help: "Items re-queued with a delay: retries after a failed attempt, and the status writer's " +
				"hold of a restart in progress."}, label),
	}
	reg.MustRegister(p.depth, p.adds, p.latency, p.workDuration, p.unfinished, p.longest, p.retries)
	return p
}

// NewDepthMetric implements workqueue.MetricsProvider.
func (p *Provider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.depth.WithLabelValues(name)
}

// NewAddsMetric implements workqueue.MetricsProvider.
func (p *Provider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.adds.WithLabelValues(name)
}

// NewLatencyMetric implements workqueue.MetricsProvider.
func (p *Provider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.latency.WithLabelValues(name)
}

// NewWorkDurationMetric implements workqueue.MetricsProvider.
func (p *Provider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.workDuration.WithLabelValues(name)
}

// NewUnfinishedWorkSecondsMetric implements workqueue.MetricsProvider.
func (p *Provider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.unfinished.WithLabelValues(name)
}

// NewLongestRunningProcessorSecondsMetric implements workqueue.MetricsProvider.
func (p *Provider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.longest.WithLabelValues(name)
}

// NewRetriesMetric implements workqueue.MetricsProvider.
func (p *Provider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.retries.WithLabelValues(name)
}
