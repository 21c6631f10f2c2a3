// SPDX-License-Identifier: Apache-2.0

package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// Metrics are the pool controller's: the selected nodes of each pool by state (what its status counts),
// whether it is halted now (what an alert waits on: a halt needs a decision), and the halts. Only the leader
// sets them; on the other replicas the series are absent, so a sum over replicas is the leader's.
type Metrics struct {
	nodes  *prometheus.GaugeVec
	halted *prometheus.GaugeVec
	halts  *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "pool", Name: "nodes",
			Help: "Nodes a KubeletConfigPool selects, by state: selected, updated, ready, in_progress, failed, drifted, " +
				"held (the pool's status.nodes)."},
			[]string{"pool", "state"}),
		halted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dkc", Subsystem: "pool", Name: "halted",
			Help: "1 while a KubeletConfigPool is halted (its Halted condition is True): it assigns nothing until its config, " +
				"maxFailures or spec.retry changes."},
			[]string{"pool"}),
		halts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dkc", Subsystem: "pool", Name: "halts_total",
			Help: "Times a KubeletConfigPool halted: its failures reached maxFailures (the Halted condition turned True)."},
			[]string{"pool"}),
	}
	reg.MustRegister(m.nodes, m.halted, m.halts)
	return m
}

// observe sets the pool's gauges from the status the sync computed.
func (m *Metrics) observe(pool string, st v1alpha1.KubeletConfigPoolStatus) {
	if m == nil {
		return
	}
	halted := 0.0
	if meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionHalted) {
		halted = 1
	}
	m.halted.WithLabelValues(pool).Set(halted)
	c := st.Nodes
	for state, v := range map[string]int32{"selected": c.Selected, "updated": c.Updated, "ready": c.Ready,
		"in_progress": c.InProgress, "failed": c.Failed, "held": c.Held,
		"drifted": c.Drifted} {
		m.nodes.WithLabelValues(pool, state).Set(float64(v))
	}
}

func (m *Metrics) countHalt(pool string) {
	if m != nil {
		m.halts.WithLabelValues(pool).Inc()
	}
}

// forget drops a deleted pool's series; and every pool's when this replica stops leading (reset).
func (m *Metrics) forget(pool string) {
	if m != nil {
		m.nodes.DeletePartialMatch(prometheus.Labels{"pool": pool})
		m.halted.DeletePartialMatch(prometheus.Labels{"pool": pool})
		m.halts.DeletePartialMatch(prometheus.Labels{"pool": pool})
	}
}

func (m *Metrics) reset() {
	if m != nil {
		m.nodes.Reset()
		m.halted.Reset()
	}
}
