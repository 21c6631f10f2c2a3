package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
)

// Results of a run: Values are the measured figures by the keys (and a few more), Goals the
// targets some of them are held to.
type Results struct {
	Machine string             `json:"machine"`
	Took    string             `json:"took"`
	Values  map[string]float64 `json:"values"`
	Notes   map[string]float64 `json:"notes"`
	Goals   map[string]goal    `json:"goals"`
}

type goal struct {
	Op    string  `json:"op"` // "<=" or ">="
	Value float64 `json:"value"`
	Met   bool    `json:"met"`
}

// goals of the scale issue.
var goals = map[string]goal{
	"propagation_p99_ratio_to_bare_watch":            {Op: "<=", Value: 1.5},
	"fanout_2000_all_checkpointed_seconds":           {Op: "<=", Value: 5},
	"apiserver_watch_ratio_per_node_design_over_dkc": {Op: ">=", Value: 10},
	"service_rss_bytes_per_node_at_5000":             {Op: "<=", Value: 40960},
	"node_writes_per_node_per_assignment":            {Op: "<=", Value: 2},
	"sidecar_idle_rss_bytes":                         {Op: "<=", Value: 30 << 20},
}

func newResults() *Results {
	return &Results{Machine: machine(), Values: map[string]float64{}, Notes: map[string]float64{}, Goals: map[string]goal{}}
}

func (r *Results) set(key string, v float64) {
	r.Values[key] = v
	if g, ok := goals[key]; ok {
		g.Met = (g.Op == "<=" && v <= g.Value) || (g.Op == ">=" && v >= g.Value)
		r.Goals[key] = g
	}
}

func (r *Results) note(key string, v float64) { r.Notes[key] = v }

// AllMet reports whether every goal was measured and met.
func (r *Results) AllMet() bool {
	for k := range goals {
		if !r.Goals[k].Met {
			return false
		}
	}
	return true
}

// WriteJSON writes results.json into dir: every value as a top-level key, with machine, goals and notes.
func (r *Results) WriteJSON(dir string) (string, error) {
	out := map[string]any{"machine": r.Machine, "took": r.Took, "goals": r.Goals, "notes": r.Notes}
	for k, v := range r.Values {
		out[k] = v
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "results.json")
	return path, os.WriteFile(path, append(data, '\n'), 0o644)
}

// Table prints the figures with their goals.
func (r *Results) Table(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "METRIC\tVALUE\tGOAL\tMET\n")
	keys := make([]string, 0, len(r.Values))
	for k := range r.Values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		g, ok := r.Goals[k]
		goalText, met := "", ""
		if ok {
			goalText = fmt.Sprintf("%s %s", g.Op, format(k, g.Value))
			met = map[bool]string{true: "yes", false: "NO"}[g.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k, format(k, r.Values[k]), goalText, met)
	}
	for k := range goals {
		if _, ok := r.Values[k]; !ok {
			fmt.Fprintf(tw, "%s\t(not measured)\t\tNO\n", k)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "machine: %s; took %s\n", r.Machine, r.Took)
}

func format(key string, v float64) string {
	switch {
	case strings.HasSuffix(key, "_seconds"):
		return fmt.Sprintf("%.3fs", v)
	case strings.Contains(key, "rss_bytes") && v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case strings.Contains(key, "bytes"):
		return fmt.Sprintf("%.0f B", v)
	case v == float64(int64(v)):
		return fmt.Sprintf("%d", int64(v))
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// machine describes this machine: CPU model and count, memory, kernel.
func machine() string {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := ""
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(strings.SplitN(string(data), "\n", 2)[0], "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d × %s%s, Linux %s, %s", runtime.NumCPU(), cpu, mem, strings.TrimSpace(string(kernel)), runtime.Version())
}
