// SPDX-License-Identifier: Apache-2.0

package monitoring

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// componentDir is the component under test, relative to the repository root.
const componentDir = "deploy/components/monitoring"

// jobs are the job labels pod-monitors.yaml gives dkc's targets (the pods' app.kubernetes.io/name), and
// the kind of workload whose pods each scrapes.
var jobs = map[string]string{"dkc-server": "Deployment", "dkc-sidecar": "DaemonSet"}

// targetLabels are the labels Prometheus gives every series of a dkc target: the PodMonitors' job and node,
// the Prometheus Operator's namespace, pod, container and endpoint, and instance.
var targetLabels = []string{"job", "namespace", "pod", "container", "endpoint", "instance", "node"}

// checkedPrefixes are the metric names that must be dkc's: its own, and the workqueue metrics dkc-server
// exports under Kubernetes' names. Other names (kube-state-metrics', cAdvisor's, Go's and the process's)
// come from elsewhere and are taken as written.
var checkedPrefixes = []string{"dkc_", "workqueue_"}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// newParser is Prometheus's PromQL parser with its defaults, as a Prometheus server without feature flags
// parses rules and queries.
func newParser() parser.Parser { return parser.NewParser(parser.Options{}) }

// checker checks expressions against what dkc exports.
type checker struct {
	exported exported
	recorded map[string]bool // names recording rules define
	used     map[string]bool // exported families the checked expressions name
}

func newChecker(e exported) *checker {
	return &checker{exported: e, recorded: map[string]bool{}, used: map[string]bool{}}
}

// check parses expr and reports each way it names something that does not exist: a dkc metric dkc does
// not export, a job no PodMonitor scrapes, a phase dkc_sidecar_phase never takes.
func (c *checker) check(expr string) []error {
	e, err := newParser().ParseExpr(expr)
	if err != nil {
		return []error{fmt.Errorf("parse: %w", err)}
	}
	var errs []error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			errs = append(errs, c.selector(n.Name, n.LabelMatchers)...)
		case *parser.AggregateExpr:
			errs = append(errs, c.labelsOn(n.Op.String(), n.Grouping, n.Expr)...)
		case *parser.BinaryExpr:
			if n.VectorMatching != nil { // on() or ignoring(), each side
				errs = append(errs, c.labelsOn(n.Op.String(), n.VectorMatching.MatchingLabels, n.LHS)...)
				errs = append(errs, c.labelsOn(n.Op.String(), n.VectorMatching.MatchingLabels, n.RHS)...)
			}
		}
		return nil
	})
	return errs
}

// labelsOn checks the labels a by(), without(), on() or ignoring() names against those the series of expr
// can carry, when every series expr selects is a dkc family (anything else, or label_replace and
// label_join, which make labels, is taken as written): a misspelt label groups everything into one series
// or matches nothing.
func (c *checker) labelsOn(op string, names []string, expr parser.Node) []error {
	if len(names) == 0 {
		return nil
	}
	have := map[string]bool{}
	checkable := true
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.Call:
			if n.Func.Name == "label_replace" || n.Func.Name == "label_join" {
				checkable = false
			}
		case *parser.VectorSelector:
			name := n.Name
			for _, m := range n.LabelMatchers {
				if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			set, ok := c.labelsOf(name)
			if !ok {
				checkable = false
			}
			for l := range set {
				have[l] = true
			}
		}
		return nil
	})
	if !checkable {
		return nil
	}
	var errs []error
	for _, l := range names {
		if !have[l] {
			errs = append(errs, fmt.Errorf("%s with (%s): label %q is on none of the series it groups or matches (%v)", op, strings.Join(names, ", "), l, sortedKeys(have)))
		}
	}
	return errs
}

// labelsOf is the labels a series of a dkc family can carry: its own, the target's, and a histogram's le
// or a summary's quantile; ok is false for a name that is not a checked dkc series.
func (c *checker) labelsOf(name string) (map[string]bool, bool) {
	if !slices.ContainsFunc(checkedPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) || c.recorded[name] {
		return nil, false
	}
	f, ok := c.exported.series(name)
	if !ok {
		return nil, false
	}
	set := map[string]bool{model.MetricNameLabel: true}
	for _, l := range append(slices.Clone(targetLabels), f.labels...) {
		set[l] = true
	}
	switch {
	case f.kind == kindHistogram && strings.HasSuffix(name, "_bucket"):
		set["le"] = true
	case f.kind == kindSummary && name == f.name:
		set["quantile"] = true
	}
	return set, true
}

// selector checks one vector selector: its name (name may be "": then the __name__ matcher says it) and
// its matchers.
func (c *checker) selector(name string, matchers []*labels.Matcher) []error {
	var errs []error
	for _, m := range matchers {
		switch {
		case m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual:
			name = m.Value
		case m.Name == model.MetricNameLabel:
			errs = append(errs, fmt.Errorf("selector %s: name the metric, not a pattern of names: this test cannot check a pattern", m))
		case m.Name == "job" && m.Type == labels.MatchEqual:
			if _, ok := jobs[m.Value]; !ok {
				errs = append(errs, fmt.Errorf("job %q: the PodMonitors give dkc's targets the jobs %v", m.Value, sortedKeys(jobs)))
			}
		}
	}
	if name == "" {
		return errs
	}
	if c.recorded[name] {
		return errs
	}
	if !slices.ContainsFunc(checkedPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
		return errs
	}
	f, ok := c.exported.series(name)
	if !ok {
		return append(errs, fmt.Errorf("metric %s: dkc exports no such series (its metrics: %s)", name, strings.Join(c.exportedNames(), ", ")))
	}
	c.used[f.name] = true
	have, _ := c.labelsOf(name)
	for _, m := range matchers {
		if !have[m.Name] {
			errs = append(errs, fmt.Errorf("selector %s: %s has no label %q (its own: %v; the target's: %v)", m, name, m.Name, f.labels, targetLabels))
		}
	}
	if f.name == "dkc_sidecar_phase" {
		errs = append(errs, c.phases(matchers)...)
	}
	return errs
}

// phases checks that a phase matcher of dkc_sidecar_phase names phases the agent has (a misspelt phase
// makes an alert that never fires).
func (c *checker) phases(matchers []*labels.Matcher) []error {
	known := c.exported.typed["Phase"]
	var errs []error
	for _, m := range matchers {
		if m.Name != "phase" {
			continue
		}
		var values []string
		switch m.Type {
		case labels.MatchEqual, labels.MatchNotEqual:
			values = []string{m.Value}
		default:
			if !regexp.MustCompile(`^[A-Za-z]+(\|[A-Za-z]+)*$`).MatchString(m.Value) {
				errs = append(errs, fmt.Errorf("phase matcher %s: only alternatives of phase names can be checked", m))
				continue
			}
			values = strings.Split(m.Value, "|")
		}
		for _, v := range values {
			if !slices.Contains(known, v) {
				errs = append(errs, fmt.Errorf("phase %q: dkc_sidecar_phase's phases are %v (sidecar/internal/agent)", v, known))
			}
		}
	}
	return errs
}

// exportedNames lists the checked families dkc exports, for messages.
func (c *checker) exportedNames() []string {
	var out []string
	for _, n := range sortedKeys(c.exported.families) {
		if slices.ContainsFunc(checkedPrefixes, func(p string) bool { return strings.HasPrefix(n, p) }) {
			out = append(out, n)
		}
	}
	return out
}

// TestCheckerCatches: the checks themselves fail on what they are for — a good expression passes, a
// broken one, a misspelt dkc metric, a histogram's bare name, a wrong job and a misspelt phase do not.
func TestCheckerCatches(t *testing.T) {
	e := mustReadExported(t)
	for _, tc := range []struct {
		expr string
		ok   bool
	}{
		{`sum by (reason) (rate(dkc_server_token_refusals_total{job="dkc-server"}[5m]))`, true},
		{`histogram_quantile(0.99, sum by (le) (rate(dkc_server_push_latency_seconds_bucket[5m])))`, true},
		{`{__name__="dkc_sidecar_connected"} == 0`, true},
		{`dkc_sidecar_phase{phase=~"RolledBack|LocalFallback"} == 1`, true},
		{`container_memory_working_set_bytes{container="dkc-server"}`, true}, // not dkc's: taken as written
		{`sum(rate(dkc_server_token_refusals_total[5m])`, false},             // unbalanced
		{`rate(dkc_server_token_refusals_total)`, false},                     // rate of an instant vector
		{`dkc_server_token_refusal_total > 0`, false},                        // misspelt
		{`dkc_server_push_latency_seconds > 1`, false},                       // a histogram has no bare series
		{`workqueue_dept > 0`, false},
		{`up{job="dkc-sidecars"} == 0`, false},
		{`dkc_sidecar_phase{phase="Rolledback"} == 1`, false},
		{`dkc_sidecar_phase{phase=~"RolledBack|Fail.*"} == 1`, false},
		{`{__name__=~"dkc_.*"}`, false},
		{`dkc_server_token_refusals_total{reasons="expired"}`, false},                   // not a label of it
		{`sum by (reasons) (rate(dkc_server_token_refusals_total[5m]))`, false},         // by() a label it lacks
		{`sum without (nodes) (dkc_sidecar_connected)`, false},                          // without() too
		{`dkc_server_connections - on (pods) dkc_server_connected_nodes`, false},        // on() too
		{`sum by (node, phase) (dkc_sidecar_phase{node="n1"})`, true},                   // own and target labels
		{`sum by (name, le) (rate(workqueue_queue_duration_seconds_bucket[5m]))`, true}, // a histogram's le
		{`sum by (result) (up) / on (result) sum by (result) (rate(dkc_server_token_reviews_total[5m]))`, true},
	} {
		errs := newChecker(e).check(tc.expr)
		if tc.ok && len(errs) > 0 {
			t.Errorf("%s: %v", tc.expr, errs)
		}
		if !tc.ok && len(errs) == 0 {
			t.Errorf("%s: passed", tc.expr)
		}
	}
}
