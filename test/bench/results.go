// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
)

// Results of a run: Values are the measured figures by the keys (and a few more), Goals the
// targets some of them are held to.
type Results struct {
	Machine string `json:"machine"`
	Took    string `json:"took"`
	// Revision is the checkout's git commit; TreeClean whether it had no changes, else Modified lists them
	// (`git status --porcelain`): figures of a dirty tree are not the commit's.
	Revision  string   `json:"revision"`
	TreeClean bool     `json:"treeClean"`
	Modified  []string `json:"modified,omitempty"`
	// Disk is where the simulated nodes' durable writes went (DiskSimulated or DiskShared).
	Disk string `json:"disk"`
	// ServiceArgs are the flags dkc-server ran with beyond the dev cluster's (deployment.serviceArgs).
	ServiceArgs []string           `json:"serviceArgs"`
	Values      map[string]float64 `json:"values"`
	Notes       map[string]float64 `json:"notes"`
	Goals       map[string]goal    `json:"goals"`
	// Breakdowns are the watches phase's windows by apiserver request: dkc's beside the design's.
	Breakdowns []breakdownComparison `json:"apiserverBreakdowns,omitempty"`
	// Windows are the other phases' measured apiserver windows (the replicas phase's failover).
	Windows []apiserverWindowResult `json:"apiserverWindows,omitempty"`
	// goals are the targets, goals' unless overridden (the Deployment's memory limit, read at run time).
	goals map[string]goal
}

type goal struct {
	Op    string  `json:"op"` // "<=" or ">="
	Value float64 `json:"value"`
	Met   bool    `json:"met"`
}

// goals of the scale issue.
var goals = map[string]goal{
	// The worst of Config.Repetitions in one run.
	"propagation_p99_ratio_to_bare_watch":            {Op: "<=", Value: 1.5},
	"propagation_p99_ratio_to_bare_watch_at_10000":   {Op: "<=", Value: 1.5},
	"fanout_2000_all_checkpointed_seconds":           {Op: "<=", Value: 5},
	"apiserver_watch_ratio_per_node_design_over_dkc": {Op: ">=", Value: 10},
	// Issue 42: the apiserver's CPU from a dkc-server start until every node is served (plus 15 s idle),
	// against the per-kubelet design's informers starting, with one shared ConfigMap and with one per node.
	"apiserver_start_cpu_ratio_dkc_over_design":                {Op: "<=", Value: 1.0 / 3},
	"apiserver_start_cpu_ratio_dkc_over_design_own_configmaps": {Op: "<=", Value: 1.0 / 3},
	// RSS and live memory per node and the control-plane ratio are reported without a goal (issue 28: the
	// 64 KB goal is retired; TestStreamMemory guards the per-stream figures).
	"node_writes_per_node_per_assignment": {Op: "<=", Value: 2},
	"sidecar_idle_rss_bytes":              {Op: "<=", Value: 30 << 20},
	// 1 GiB, or the shipped Deployment's limits.memory (deploy/base/server.yaml) if lower: set at run time.
	"service_rss_peak_bytes_at_10000": {Op: "<=", Value: peakGoal},
	// After a fan-out to every node of one replica, until every Node shows the new config active: dkc with
	// the Deployment's flags against a bare client making the same writes at full speed.
	"fleet_status_ratio_dkc_over_bare_client_at_10000": {Op: "<=", Value: 1.5},
	// Issue 27: a pool's nodes in progress at once, by its status and by the Nodes, never above its
	// maxUnavailable: 10% of the pool's nodes (Config.PoolNodes), set at run time.
	"pool_max_in_progress": {Op: "<=", Value: 200},
	// Issue 42: the survivor of two replicas, every node on it after the other was killed mid-fan-out,
	// within the Deployment's limits.memory (set at run time). The phase's other figures have no goal.
	"replicas_survivor_peak_rss_bytes": {Op: "<=", Value: peakGoal},
}

// peakGoal is the most RSS one replica may reach with 10,000 nodes, fan-out included.
const peakGoal = 1 << 30

func newResults() *Results {
	return &Results{Machine: machine(), Values: map[string]float64{}, Notes: map[string]float64{},
		Goals: map[string]goal{}, goals: maps.Clone(goals)}
}

func (r *Results) set(key string, v float64) {
	r.Values[key] = v
	if g, ok := r.goals[key]; ok {
		g.Met = (g.Op == "<=" && v <= g.Value) || (g.Op == ">=" && v >= g.Value)
		r.Goals[key] = g
	}
}

// setGoal replaces the goal of key (before it is set).
func (r *Results) setGoal(key string, g goal) { r.goals[key] = g }

// note records v under key; a value JSON cannot hold (NaN, ±Inf) is recorded as key_not_finite, so that
// one odd figure does not cost the run its results.json.
func (r *Results) note(key string, v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		r.Notes[key+"_not_finite"] = 1
		return
	}
	r.Notes[key] = v
}

// AllMet reports whether every goal was measured and met.
func (r *Results) AllMet() bool {
	for k := range r.goals {
		if !r.Goals[k].Met {
			return false
		}
	}
	return true
}

// WriteJSON writes results.json into dir: every value as a top-level key, with machine, goals and notes.
func (r *Results) WriteJSON(dir string) (string, error) {
	out := map[string]any{"machine": r.Machine, "took": r.Took, "goals": r.Goals, "notes": r.Notes,
		"revision": r.Revision, "treeClean": r.TreeClean, "modified": r.Modified, "disk": r.Disk,
		"serviceArgs": r.ServiceArgs}
	if len(r.Breakdowns) > 0 {
		out["apiserverBreakdowns"] = r.Breakdowns
	}
	if len(r.Windows) > 0 {
		out["apiserverWindows"] = r.Windows
	}
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
		goalText, met := "—", "—" // no goal: a figure reported as measured
		if ok {
			goalText = fmt.Sprintf("%s %s", g.Op, format(k, g.Value))
			met = map[bool]string{true: "yes", false: "NO"}[g.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k, format(k, r.Values[k]), goalText, met)
	}
	for k := range r.goals {
		if _, ok := r.Values[k]; !ok {
			fmt.Fprintf(tw, "%s\t(not measured)\t\tNO\n", k)
		}
	}
	tw.Flush()
	for _, b := range r.Breakdowns {
		b.print(w)
	}
	for _, b := range r.Windows {
		b.print(w)
	}
	fmt.Fprintf(w, "machine: %s; took %s\n", r.Machine, r.Took)
	clean := "clean tree"
	if !r.TreeClean {
		clean = fmt.Sprintf("DIRTY tree (%d paths changed: %s)", len(r.Modified), strings.Join(r.Modified, ", "))
	}
	fmt.Fprintf(w, "revision: %s, %s; simulated nodes' disk: %s\n", r.Revision, clean, r.Disk)
	fmt.Fprintf(w, "dkc-server flags (the Deployment's, less its ports and files, plus the benchmark's): %s\n",
		strings.Join(r.ServiceArgs, " "))
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
	return fmt.Sprintf("%d × %s%s, Linux %s, %s", runtime.NumCPU(), cpu, mem, strings.TrimSpace(string(kernel)),
		runtime.Version())
}

// gitState is the checkout's commit and whether its tree is clean (untracked files count: a new file can
// change what is built). Unknown if git fails.
func gitState() (revision string, clean bool, modified []string) {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")", false, nil
	}
	revision = strings.TrimSpace(string(out))
	out, err = exec.Command("git", "status", "--porcelain").Output()
	if err != nil {
		return revision, false, []string{"unknown: " + err.Error()}
	}
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			modified = append(modified, line)
		}
	}
	return revision, len(modified) == 0, modified
}
