// SPDX-License-Identifier: Apache-2.0

package monitoring

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"go.yaml.in/yaml/v3"
)

// runbookBase is where each alert's runbook_url points: its section of docs/monitoring.md.
const runbookBase = "https://github.com/dkc-dev/dkc/blob/main/docs/monitoring.md#"

var severities = map[string]bool{"critical": true, "warning": true, "info": true}

// loadRules reads the PrometheusRule and loads its groups as Prometheus loads a rule file (rulefmt: every
// expression through the PromQL parser, every label and annotation through the alert template parser,
// unknown fields refused).
func loadRules(t *testing.T, root string) *rulefmt.RuleGroups {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, componentDir, "prometheus-rule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		APIVersion string    `yaml:"apiVersion"`
		Kind       string    `yaml:"kind"`
		Spec       yaml.Node `yaml:"spec"`
	}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatalf("prometheus-rule.yaml: %v", err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("prometheus-rule.yaml is a %s %s, want a monitoring.coreos.com/v1 PrometheusRule", pr.APIVersion, pr.Kind)
	}
	// A PrometheusRule's spec is a rule file's content: {groups: [...]}. Names are held to the legacy
	// (pre-UTF-8) rules, so that the rules load on Prometheus 2 as on 3.
	spec, err := yaml.Marshal(&pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(spec, false, model.LegacyValidation, newParser(), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("prometheus-rule.yaml: %v", err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		t.Fatal("prometheus-rule.yaml: no rule group")
	}
	return groups
}

// TestRules: the rules load as Prometheus loads them; every expression names only metrics dkc exports
// (or that come from kube-state-metrics, cAdvisor and Prometheus itself), jobs the PodMonitors make, and
// phases the sidecar has; every alert has a severity, a summary and description, and a runbook in
// docs/monitoring.md.
func TestRules(t *testing.T) {
	root := repoRoot(t)
	groups := loadRules(t, root)
	c := newChecker(mustReadExported(t))
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				c.recorded[r.Record] = true
			}
		}
	}
	docs, err := os.ReadFile(filepath.Join(root, "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			for _, err := range c.check(r.Expr) {
				t.Errorf("%s: %s: %v", g.Name, name, err)
			}
			if r.Alert == "" {
				continue
			}
			alerts++
			for _, err := range alertErrors(r, string(docs)) {
				t.Errorf("alert %s: %v", r.Alert, err)
			}
		}
	}
	if alerts == 0 {
		t.Error("no alert")
	}
}

// alertErrors is what an alert lacks for an operator: a known severity, a summary and a description, and
// a runbook_url whose section docs/monitoring.md has.
func alertErrors(r rulefmt.Rule, docs string) []error {
	var errs []error
	if !severities[r.Labels["severity"]] {
		errs = append(errs, fmt.Errorf("severity %q, want one of critical, warning, info", r.Labels["severity"]))
	}
	for _, a := range []string{"summary", "description"} {
		if strings.TrimSpace(r.Annotations[a]) == "" {
			errs = append(errs, fmt.Errorf("no %s annotation", a))
		}
	}
	anchor := strings.ToLower(r.Alert)
	if got := r.Annotations["runbook_url"]; got != runbookBase+anchor {
		errs = append(errs, fmt.Errorf("runbook_url %q, want %s%s", got, runbookBase, anchor))
	}
	// GitHub's anchor of a heading that is the alert's name is its name in lower case.
	if !regexp.MustCompile(`(?m)^#{2,4} ` + regexp.QuoteMeta(r.Alert) + `\s*$`).MatchString(docs) {
		errs = append(errs, fmt.Errorf("docs/monitoring.md has no heading %q, its runbook", r.Alert))
	}
	return errs
}

// TestAlertErrors: an alert without severity, annotations or runbook section is reported.
func TestAlertErrors(t *testing.T) {
	docs := "# Monitoring\n\n### DkcGood\n\nWhat to do.\n"
	good := rulefmt.Rule{Alert: "DkcGood", Labels: map[string]string{"severity": "warning"},
		Annotations: map[string]string{"summary": "s", "description": "d", "runbook_url": runbookBase + "dkcgood"}}
	if errs := alertErrors(good, docs); len(errs) > 0 {
		t.Fatalf("good alert: %v", errs)
	}
	for name, mutate := range map[string]func(r *rulefmt.Rule){
		"no severity":      func(r *rulefmt.Rule) { delete(r.Labels, "severity") },
		"unknown severity": func(r *rulefmt.Rule) { r.Labels["severity"] = "page" },
		"no summary":       func(r *rulefmt.Rule) { delete(r.Annotations, "summary") },
		"no description":   func(r *rulefmt.Rule) { r.Annotations["description"] = " " },
		"wrong runbook":    func(r *rulefmt.Rule) { r.Annotations["runbook_url"] = runbookBase + "dkcbad" },
		"no runbook": func(r *rulefmt.Rule) {
			r.Alert = "DkcUndocumented"
			r.Annotations["runbook_url"] = runbookBase + "dkcundocumented"
		},
	} {
		r := good
		r.Labels = map[string]string{"severity": "warning"}
		r.Annotations = map[string]string{"summary": "s", "description": "d", "runbook_url": runbookBase + "dkcgood"}
		mutate(&r)
		if len(alertErrors(r, docs)) == 0 {
			t.Errorf("%s: not reported", name)
		}
	}
}
