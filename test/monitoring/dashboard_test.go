// SPDX-License-Identifier: Apache-2.0

package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dashboard is what this test reads of a Grafana dashboard.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string      `json:"expr"`
		RefID      string      `json:"refId"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Type  string          `json:"type"`
	Name  string          `json:"name"`
	Query json.RawMessage `json:"query"` // a string, or {"query": "..."}
}

// dashboardDS is the data source every query names: the dashboard's own variable, so that it works with
// whatever the Prometheus data source is called.
var dashboardDS = datasource{Type: "prometheus", UID: "${datasource}"}

// grafanaBuiltins stand in for Grafana's interval variables while parsing.
var grafanaBuiltins = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600", "__interval_ms": "60000"}

// grafanaVar matches $name, ${name}, ${name:format} and [[name]].
var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// expand replaces the dashboard's variables and Grafana's interval variables with sample values, and
// names the variables it found that the dashboard does not define.
func expand(expr string, vars map[string]bool) (string, []string) {
	var undefined []string
	return grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVar.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		if v, ok := grafanaBuiltins[name]; ok {
			return v
		}
		if vars[name] {
			return "sample"
		}
		undefined = append(undefined, m)
		return m
	}), undefined
}

// parseable expands expr, or says which variables it uses that the dashboard does not define.
func parseable(expr string, vars map[string]bool) (string, error) {
	out, undefined := expand(expr, vars)
	if len(undefined) > 0 {
		return "", fmt.Errorf("variables %v: the dashboard defines no such variable", undefined)
	}
	return out, nil
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// dashboardErrors checks a dashboard: unique panel ids, a place on the grid, every panel's queries on the
// dashboard's data source variable and parsed (with checker's checks), every template variable's query
// too.
func dashboardErrors(d dashboard, c *checker) []error {
	var errs []error
	if d.UID == "" || d.Title == "" {
		errs = append(errs, fmt.Errorf("uid %q, title %q: both must be set (Grafana's sidecar keys dashboards by uid)", d.UID, d.Title))
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource", "interval", "custom", "constant", "textbox":
			continue
		case "query":
		default:
			errs = append(errs, fmt.Errorf("variable %s: type %q not checked here", v.Name, v.Type))
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				errs = append(errs, fmt.Errorf("variable %s: query: %w", v.Name, err))
				continue
			}
			q = obj.Query
		}
		m := labelValues.FindStringSubmatch(strings.TrimSpace(q))
		if m == nil {
			errs = append(errs, fmt.Errorf("variable %s: query %q, want label_values(<selector>, <label>)", v.Name, q))
			continue
		}
		sel, err := parseable(m[1], vars)
		if err != nil {
			errs = append(errs, fmt.Errorf("variable %s: %w", v.Name, err))
			continue
		}
		matchers, err := newParser().ParseMetricSelector(sel)
		if err != nil {
			errs = append(errs, fmt.Errorf("variable %s: selector %s: %w", v.Name, m[1], err))
			continue
		}
		for _, err := range c.selector("", matchers) {
			errs = append(errs, fmt.Errorf("variable %s: %w", v.Name, err))
		}
	}
	ids := map[int]string{}
	queries := 0
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if prev, ok := ids[p.ID]; ok {
				errs = append(errs, fmt.Errorf("%s: id %d is also panel %q's", where, p.ID, prev))
			}
			ids[p.ID] = p.Title
			if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				errs = append(errs, fmt.Errorf("%s: no place within Grafana's 24 columns", where))
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Type == "text" {
				continue
			}
			if p.Datasource == nil || *p.Datasource != dashboardDS {
				errs = append(errs, fmt.Errorf("%s: datasource %v, want %v", where, p.Datasource, dashboardDS))
			}
			if len(p.Targets) == 0 {
				errs = append(errs, fmt.Errorf("%s: no query", where))
			}
			for _, tg := range p.Targets {
				if tg.Datasource == nil || *tg.Datasource != dashboardDS {
					errs = append(errs, fmt.Errorf("%s, query %s: datasource %v, want %v", where, tg.RefID, tg.Datasource, dashboardDS))
				}
				if strings.TrimSpace(tg.Expr) == "" {
					errs = append(errs, fmt.Errorf("%s, query %s: no expression", where, tg.RefID))
					continue
				}
				queries++
				expr, err := parseable(tg.Expr, vars)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s, query %s: %w", where, tg.RefID, err))
					continue
				}
				for _, err := range c.check(expr) {
					errs = append(errs, fmt.Errorf("%s, query %s (%s): %w", where, tg.RefID, tg.Expr, err))
				}
			}
		}
	}
	walk(d.Panels)
	if queries == 0 {
		errs = append(errs, fmt.Errorf("no query in the dashboard"))
	}
	return errs
}

func loadDashboard(t *testing.T, root string) dashboard {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, componentDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// TestDashboard: every panel's query and every variable's query parses and names only what exists, and
// every metric family dkc exports has a panel: a metric added to dkc without one fails here.
func TestDashboard(t *testing.T) {
	c := newChecker(mustReadExported(t))
	d := loadDashboard(t, repoRoot(t))
	for _, err := range dashboardErrors(d, c) {
		t.Errorf("dashboard.json: %v", err)
	}
	for _, name := range c.exportedNames() {
		if !c.used[name] {
			t.Errorf("dashboard.json: no panel shows %s (%s), which dkc exports", name, c.exported.families[name].pos)
		}
	}
}

// TestDashboardErrors: a broken query, an unknown metric, a query outside the data source variable, an
// undefined variable and a duplicate id are each reported.
func TestDashboardErrors(t *testing.T) {
	c := newChecker(mustReadExported(t))
	good := `{"uid": "u", "title": "t",
	  "templating": {"list": [{"type": "datasource", "name": "datasource"},
	    {"type": "query", "name": "node", "query": {"query": "label_values(dkc_sidecar_connected{job=\"dkc-sidecar\"}, node)"}}]},
	  "panels": [{"id": 1, "type": "row", "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0}, "panels": []},
	    {"id": 2, "type": "timeseries", "gridPos": {"h": 8, "w": 12, "x": 0, "y": 1},
	     "datasource": {"type": "prometheus", "uid": "${datasource}"},
	     "targets": [{"refId": "A", "datasource": {"type": "prometheus", "uid": "${datasource}"},
	       "expr": "sum(rate(dkc_sidecar_kubelet_restarts_total{node=~\"$node\"}[$__rate_interval]))"}]}]}`
	parse := func(s string) dashboard {
		var d dashboard
		if err := json.Unmarshal([]byte(s), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if errs := dashboardErrors(parse(good), c); len(errs) > 0 {
		t.Fatalf("good dashboard: %v", errs)
	}
	for name, replace := range map[string][2]string{
		"broken query":      {`[$__rate_interval]))`, `[$__rate_interval])`},
		"unknown metric":    {`dkc_sidecar_kubelet_restarts_total`, `dkc_sidecar_kubelet_restart_total`},
		"other data source": {`"targets": [{"refId": "A", "datasource": {"type": "prometheus", "uid": "${datasource}"}`, `"targets": [{"refId": "A", "datasource": {"type": "prometheus", "uid": "prom"}`},
		"undefined var":     {`=~\"$node\"`, `=~\"$nodes\"`},
		"duplicate id":      {`{"id": 2,`, `{"id": 1,`},
		"variable query":    {`label_values(dkc_sidecar_connected{`, `label_values(dkc_sidecar_connectd{`},
		"no place":          {`"w": 12, "x": 0`, `"w": 12, "x": 16`},
	} {
		bad := strings.Replace(good, replace[0], replace[1], 1)
		if bad == good {
			t.Fatalf("%s: the mutation does not apply", name)
		}
		if len(dashboardErrors(parse(bad), c)) == 0 {
			t.Errorf("%s: not reported", name)
		}
	}
}
