// SPDX-License-Identifier: Apache-2.0

// Package monitoring checks deploy/components/monitoring, what operators plug into their Prometheus and
// Grafana: the rules load as Prometheus loads a rule file (every expression through Prometheus's own
// parser, every annotation through its template parser), every dashboard query parses, every dkc metric
// an expression names is one dkc exports and every label named on it one it carries — found by reading
// dkc's Go source, so a renamed metric or label fails here rather than leaving an alert that can never
// fire — every alert has its runbook in docs/monitoring.md, the alerts' expressions fire where they should
// and not in the routine states that look alike (evaluated by Prometheus's engine on series shaped as the
// PodMonitors make them), and the component renders onto deploy/base with `kubectl kustomize`.
//
// It is a module of its own so that dkc's go.mod does not take on github.com/prometheus/prometheus and its
// dependencies; `make test-unit` runs it and `make lint` vets it.
package monitoring
