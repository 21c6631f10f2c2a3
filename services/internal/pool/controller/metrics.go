package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// Metrics are the pool controller's: the selected nodes of each pool by state (what its status counts),
// and the halts. Only the leader sets them; on the other replicas the series are absent, so a sum over
// replicas is the leader's.
type Metrics struct {
	nodes *prometheus.GaugeVec
	halts *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "pool", Name: "nodes",
			Help: "Nodes a KubeletConfigPool selects, by state: selected, updated, ready, in_progress, failed, held (the pool's status.nodes)."},
			[]string{"pool", "state"}),
		halts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "pool", Name: "halts_total",
			Help: "Times a KubeletConfigPool halted: its failures reached maxFailures (the Halted condition turned True)."},
			[]string{"pool"}),
	}
	reg.MustRegister(m.nodes, m.halts)
	return m
}

func (m *Metrics) observe(pool string, c v1alpha1.NodeCounts) {
	if m == nil {
		return
	}
	for state, v := range map[string]int32{"selected": c.Selected, "updated": c.Updated, "ready": c.Ready,
		"in_progress": c.InProgress, "failed": c.Failed, "held": c.Held} {
		m.nodes.WithLabelValues(pool, state).Set(float64(v))
	}
}

func (m *Metrics) halted(pool string) {
	if m != nil {
		m.halts.WithLabelValues(pool).Inc()
	}
}

// forget drops a deleted pool's series; and every pool's when this replica stops leading (reset).
func (m *Metrics) forget(pool string) {
	if m != nil {
		m.nodes.DeletePartialMatch(prometheus.Labels{"pool": pool})
		m.halts.DeletePartialMatch(prometheus.Labels{"pool": pool})
	}
}

func (m *Metrics) reset() {
	if m != nil {
		m.nodes.Reset()
	}
}
