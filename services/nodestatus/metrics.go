package nodestatus

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the status writer; a nil *Metrics records nothing.
type Metrics struct {
	writes *prometheus.CounterVec
}

// NewMetrics registers the writer's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{writes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "dkc", Subsystem: "server", Name: "node_status_writes_total",
		Help: "Node status writes by result: written, unchanged (already on the Node), error.",
	}, []string{"result"})}
	reg.MustRegister(m.writes)
	return m
}

func (m *Metrics) write(result string) {
	if m != nil {
		m.writes.WithLabelValues(result).Inc()
	}
}
