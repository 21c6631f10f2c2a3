// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// Metrics are the original kubelet's node_config_* gauges (pkg/kubelet/metrics), under dkc's prefix, plus a
// restart counter. A nil *Metrics records nothing.
type Metrics struct {
	assigned, active, lkg *prometheus.GaugeVec
	errorGauge            prometheus.Gauge
	restarts              prometheus.Counter
	phase                 *prometheus.GaugeVec
	drift                 *prometheus.GaugeVec
	driftChecks           *prometheus.CounterVec
	driftRepairs          *prometheus.CounterVec
}

var sourceLabels = []string{"node_config_source", "node_config_uid", "node_config_resource_version",
	"node_config_kubelet_key"}

// NewMetrics registers the agent's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dkc", Name: name, Help: help}, sourceLabels)
	}
	m := &Metrics{
		assigned: gauge("node_config_assigned",
			"The node's assigned config: 1 on the series naming it (source \"local\" for the local config)."),
		active: gauge("node_config_active", "The config the kubelet runs: 1 on the series naming it."),
		lkg:    gauge("node_config_last_known_good", "The node's last-known-good config: 1 on the series naming it."),
		errorGauge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dkc", Name: "node_config_error",
			Help: "1 when the node's config status has an error, else 0."}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dkc", Name: "sidecar_kubelet_restarts_total",
			Help: "Kubelet restarts the sidecar performed to change the config."}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dkc", Name: "sidecar_phase",
			Help: "Where the node stands in the rollback rules (docs/design.md): 1 on the current phase, 0 on the others."},
			[]string{"phase"}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dkc", Name: "sidecar_config_drift",
			Help: "What the kubelet runs differs from what it should (the sidecar's last drift check): 1 on the " +
				"standing drift's cause, 0 on the others; all 0 when there is none."}, []string{"cause"}),
		driftChecks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dkc", Name: "sidecar_drift_checks_total",
			Help: "Drift checks by result: none (no difference), drift (one found), error (the check could not be made)."},
			[]string{"result"}),
		driftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dkc", Name: "sidecar_drift_repairs_total",
			Help: "Pools' drift repair requests the sidecar acted on, by result: repaired (wiring put back, the kubelet " +
				"restarted healthy into its assigned config), failed (the repair was made and did not come to that), " +
				"refused_repeat (the cause was repaired before for the same assignment: reported, not repaired again)."},
			[]string{"result"}),
	}
	reg.MustRegister(m.assigned, m.active, m.lkg, m.errorGauge, m.restarts, m.phase, m.drift, m.driftChecks,
		m.driftRepairs)
	m.setDrift("")
	for _, r := range []string{driftCheckNone, driftCheckDrift, driftCheckError} {
		m.driftChecks.WithLabelValues(r)
	}
	for _, r := range []string{repairRepaired, repairFailed, repairRefusedRepeat} {
		m.driftRepairs.WithLabelValues(r)
	}
	return m
}

func labels(src *dkcv1.NodeConfigSource) prometheus.Labels {
	cm := src.GetConfigMap()
	if cm == nil {
		return prometheus.Labels{"node_config_source": "local", "node_config_uid": "", "node_config_resource_version": "",
			"node_config_kubelet_key": ""}
	}
	return prometheus.Labels{
		"node_config_source":           "/api/v1/namespaces/" + cm.GetNamespace() + "/configmaps/" + cm.GetName(),
		"node_config_uid":              cm.GetUid(),
		"node_config_resource_version": cm.GetResourceVersion(),
		"node_config_kubelet_key":      cm.GetKubeletConfigKey(),
	}
}

func (m *Metrics) set(st *dkcv1.NodeConfigStatus) {
	if m == nil {
		return
	}
	for g, src := range map[*prometheus.GaugeVec]*dkcv1.NodeConfigSource{m.assigned: st.GetAssigned(),
		m.active: st.GetActive(), m.lkg: st.GetLastKnownGood()} {
		g.Reset() // the previous label set goes, as in the original
		g.With(labels(src)).Set(1)
	}
	if st.GetError() != "" {
		m.errorGauge.Set(1)
	} else {
		m.errorGauge.Set(0)
	}
}

func (m *Metrics) restarted() {
	if m != nil {
		m.restarts.Inc()
	}
}

func (m *Metrics) setPhase(p Phase) {
	if m == nil {
		return
	}
	for _, q := range Phases {
		v := 0.0
		if q == p {
			v = 1
		}
		m.phase.WithLabelValues(string(q)).Set(v)
	}
}

// setDrift sets the drift gauge: 1 on cause ("": none), 0 on every other.
func (m *Metrics) setDrift(cause string) {
	if m == nil {
		return
	}
	for _, c := range DriftCauses {
		v := 0.0
		if c == cause {
			v = 1
		}
		m.drift.WithLabelValues(c).Set(v)
	}
}

// Results of a drift check (dkc_sidecar_drift_checks_total's label).
const (
	driftCheckNone  = "none"
	driftCheckDrift = "drift"
	driftCheckError = "error"
)

func (m *Metrics) driftChecked(result string) {
	if m != nil {
		m.driftChecks.WithLabelValues(result).Inc()
	}
}

// Results of a drift repair request (dkc_sidecar_drift_repairs_total's label).
const (
	repairRepaired      = "repaired"
	repairFailed        = "failed"
	repairRefusedRepeat = "refused_repeat"
)

func (m *Metrics) driftRepaired(result string) {
	if m != nil {
		m.driftRepairs.WithLabelValues(result).Inc()
	}
}
