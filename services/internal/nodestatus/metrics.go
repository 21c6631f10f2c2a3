// SPDX-License-Identifier: Apache-2.0

package nodestatus

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the status writer; a nil *Metrics records nothing.
type Metrics struct {
	writes *prometheus.CounterVec
	events *prometheus.CounterVec
}

// NewMetrics registers the writer's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dkc", Subsystem: "server", Name: "node_status_writes_total",
			Help: "Node status writes by result: written, unchanged (already on the Node), held (a restart in progress, " +
				"waiting for its outcome), queued (a report acknowledged as queued: the inline writes were all taken), error.",
		}, []string{"result"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dkc", Subsystem: "server", Name: "restart_events_total",
			Help: "KubeletConfigChanged Events by result: created, duplicate (the apiserver had it already), known (recorded " +
				"by this replica already: no request made), error (not recorded, dropped).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.writes, m.events)
	return m
}

func (m *Metrics) write(result string) {
	if m != nil {
		m.writes.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) event(result string) {
	if m != nil {
		m.events.WithLabelValues(result).Inc()
	}
}
