// SPDX-License-Identifier: Apache-2.0

package monitoring

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// Series as the PodMonitors label them (job, namespace, pod, instance, node), and kube-state-metrics' own.
const (
	serverA  = `job="dkc-server", namespace="kube-system", pod="a", instance="10.0.0.1:9090", node="cp-1"`
	serverB  = `job="dkc-server", namespace="kube-system", pod="b", instance="10.0.0.2:9090", node="cp-2"`
	sidecar1 = `job="dkc-sidecar", namespace="kube-system", pod="dkc-sidecar-1", instance="192.168.0.1:10395", node="n1"`
	sidecar2 = `job="dkc-sidecar", namespace="kube-system", pod="dkc-sidecar-2", instance="192.168.0.2:10395", node="n2"`
	ksm      = `job="kube-state-metrics", namespace="monitoring", pod="ksm", instance="10.0.1.1:8080"`
)

// TestAlertsFire evaluates alerts' expressions, as prometheus-rule.yaml has them, on series shaped as
// the PodMonitors and kube-state-metrics make them: each fires where it should and stays silent in the
// routine states that look alike (a replica holding every node, a node opted out of dkc, dkc-server down,
// a few errors among many results). `for:` is not evaluated: the expression is what decides.
func TestAlertsFire(t *testing.T) {
	exprs := map[string]string{}
	for _, g := range loadRules(t, repoRoot(t)).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				exprs[r.Alert] = r.Expr
			}
		}
	}
	for _, tc := range []struct {
		name, alert string
		load        string
		by          string   // the label that tells the firing series apart
		want        []string // its values on the series that fire
	}{
		{
			name: "a replica holding every node is not near the cap; one with connections not nodes' is", alert: "DkcServerConnectionsNearCap",
			load: `
  dkc_server_connections{` + serverA + `} 1010x20
  dkc_server_connected_nodes{` + serverA + `} 1000x20
  dkc_server_max_connections{` + serverA + `} 1100x20
  dkc_server_connections{` + serverB + `} 400x20
  dkc_server_connected_nodes{` + serverB + `} 100x20
  dkc_server_max_connections{` + serverB + `} 1100x20`,
			by: "pod", want: []string{"b"},
		},
		{
			name: "ConfigOK False on nodes with a sidecar target, up or down", alert: "DkcNodeConfigNotOK",
			load: `
  kube_node_status_condition{` + ksm + `, node="n1", condition="ConfigOK", status="false"} 1x20
  kube_node_status_condition{` + ksm + `, node="n2", condition="ConfigOK", status="false"} 1x20
  kube_node_status_condition{` + ksm + `, node="n3", condition="ConfigOK", status="false"} 0x20
  up{` + sidecar1 + `} 1x20
  up{` + sidecar2 + `} 0x20`,
			// n2's sidecar is down (still a target): its ConfigOK counts; a node with no target (opted out)
			// has no up series at all.
			by: "node", want: []string{"n1", "n2"},
		},
		{
			name: "ConfigDrift True on nodes with a sidecar; False, or opted out, silent", alert: "DkcKubeletConfigDrift",
			load: `
  kube_node_status_condition{` + ksm + `, node="n1", condition="ConfigDrift", status="true"} 1x20
  kube_node_status_condition{` + ksm + `, node="n2", condition="ConfigDrift", status="true"} 0x20
  kube_node_status_condition{` + ksm + `, node="n2", condition="ConfigDrift", status="false"} 1x20
  kube_node_status_condition{` + ksm + `, node="n9", condition="ConfigDrift", status="true"} 1x20
  up{` + sidecar1 + `} 1x20
  up{` + sidecar2 + `} 1x20`,
			by: "node", want: []string{"n1"},
		},
		{
			name: "opted-out node", alert: "DkcNodeConfigNotOK",
			load: `
  kube_node_status_condition{` + ksm + `, node="n9", condition="ConfigOK", status="false"} 1x20
  up{` + sidecar1 + `} 1x20`,
			by: "node", want: nil,
		},
		{
			name: "a sidecar disconnected while dkc-server is up", alert: "DkcSidecarNotConnected",
			load: `
  dkc_sidecar_connected{` + sidecar1 + `} 0x20
  dkc_sidecar_connected{` + sidecar2 + `} 1x20
  up{` + serverA + `} 1x20
  up{` + serverB + `} 0x20`,
			by: "node", want: []string{"n1"},
		},
		{
			name: "every sidecar disconnected while dkc-server is down", alert: "DkcSidecarNotConnected",
			load: `
  dkc_sidecar_connected{` + sidecar1 + `} 0x20
  dkc_sidecar_connected{` + sidecar2 + `} 0x20
  up{` + serverA + `} 0x20
  up{` + serverB + `} 0x20`,
			by: "node", want: nil,
		},
		{
			name: "TokenReview errors: a share, not any", alert: "DkcServerTokenReviewsFailing",
			load: `
  dkc_server_token_reviews_total{` + serverA + `, result="authenticated"} 0+1000x20
  dkc_server_token_reviews_total{` + serverA + `, result="error"} 0+10x20
  dkc_server_token_reviews_total{` + serverB + `, result="authenticated"} 0+10x20
  dkc_server_token_reviews_total{` + serverB + `, result="error"} 0+10x20`,
			by: "pod", want: []string{"b"},
		},
		{
			name: "status write errors: a share of the writes sent", alert: "DkcServerStatusWriteErrors",
			load: `
  dkc_server_node_status_writes_total{` + serverA + `, result="unchanged"} 0+10000x20
  dkc_server_node_status_writes_total{` + serverA + `, result="queued"} 0+10000x20
  dkc_server_node_status_writes_total{` + serverA + `, result="written"} 0+10x20
  dkc_server_node_status_writes_total{` + serverA + `, result="error"} 0+10x20
  dkc_server_node_status_writes_total{` + serverB + `, result="written"} 0+1000x20
  dkc_server_node_status_writes_total{` + serverB + `, result="error"} 0+10x20`,
			by: "pod", want: []string{"a"},
		},
		{
			// The leader's series; the replica that led before reset its own when it stopped leading.
			name: "a halted pool, not a pool that halted once", alert: "DkcPoolHalted",
			load: `
  dkc_pool_halted{` + serverA + `, pool="blue"} 1x20
  dkc_pool_halted{` + serverA + `, pool="green"} 0x20
  dkc_pool_halts_total{` + serverA + `, pool="green"} 1x20`,
			by: "pool", want: []string{"blue"},
		},
		{
			name: "unauthenticated connections refused", alert: "DkcServerUnauthenticatedConnectionsRefused",
			load: `
  dkc_server_unauthenticated_connections_refused_total{` + serverA + `} 0+100x20
  dkc_server_unauthenticated_connections_refused_total{` + serverB + `} 3x20`,
			by: "pod", want: []string{"a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expr, ok := exprs[tc.alert]
			if !ok {
				t.Fatalf("no alert %s in prometheus-rule.yaml", tc.alert)
			}
			got := evalAt(t, "load 1m"+tc.load, expr, 20*time.Minute, tc.by)
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s fires for %s %v, want %v\n%s", tc.alert, tc.by, got, tc.want, expr)
			}
		})
	}
}

// evalAt loads a promqltest `load` block, evaluates expr at the given offset as a rule would be, and
// returns the sorted values of label by on the resulting series.
func evalAt(t *testing.T, load, expr string, at time.Duration, by string) []string {
	t.Helper()
	storage := promqltest.LoadedStorage(t, load)
	engine := promqltest.NewTestEngineWithOpts(t, promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, Parser: newParser()})
	q, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, time.Unix(0, 0).Add(at))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	var out []string
	for _, s := range vec {
		out = append(out, s.Metric.Get(by))
	}
	slices.Sort(out)
	return out
}
