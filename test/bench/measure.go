// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// rss is the resident set size of pid in bytes (VmRSS of /proc/<pid>/status).
func rss(pid int) (int64, error) { return procStatus(pid, "VmRSS") }

// peakRSS is the largest resident set size pid has had (VmHWM): what a memory limit must allow.
func peakRSS(pid int) (int64, error) { return procStatus(pid, "VmHWM") }

// procStatus reads a size field of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s for pid %d", field, pid)
}

// metricFamilies parses a Prometheus text exposition.
func metricFamilies(body io.Reader) (map[string]*dto.MetricFamily, error) {
	// The zero TextParser panics since prometheus/common 0.6x: a metric name validation scheme is required.
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(body)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return families, nil
}

// metricSum adds up the samples of the named metric whose labels include every pair in match.
func metricSum(families map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	var sum float64
	for _, m := range matching(families, name, match) {
		sum += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
	}
	return sum
}

// matching is family name's series whose labels include match.
func matching(families map[string]*dto.MetricFamily, name string, match map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range families[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range match {
			if labels[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

// apiserverGet GETs path from the apiserver with the benchmark's admin credentials.
func apiserverGet(ctx context.Context, rc *rest.Config, path string) ([]byte, error) {
	httpClient, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(rc.Host, "/")+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET apiserver %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET apiserver %s: %s", path, resp.Status)
	}
	return data, err
}

// apiserverWatches counts the WATCH requests the apiserver holds open on nodes and configmaps.
func apiserverWatches(ctx context.Context, rc *rest.Config) (int, error) {
	data, err := apiserverGet(ctx, rc, "/metrics")
	if err != nil {
		return 0, err
	}
	families, err := metricFamilies(strings.NewReader(string(data)))
	if err != nil {
		return 0, err
	}
	total := 0
	for _, resource := range []string{"nodes", "configmaps"} {
		total += int(metricSum(families, "apiserver_longrunning_requests",
			map[string]string{"verb": "WATCH", "resource": resource}))
	}
	return total, nil
}

// goMemory is a Go process's memory right after a forced garbage collection: RSS, heap in use and
// goroutine stacks in use. RSS alone mixes what is live with what the collector has not yet returned.
// objects is the part of heap that live objects fill (HeapAlloc); heap counts whole spans (HeapInuse), so
// heap-objects is what the allocator cannot give back while one object of a span lives (fragmentation).
type goMemory struct {
	rss, heap, objects, stack int64
}

// live is what the process keeps after a collection: heap and stacks.
func (m goMemory) live() int64 { return m.heap + m.stack }

// parseHeapProfile reads HeapInuse, HeapAlloc and StackInuse from a debug=1 heap profile (the
// runtime.MemStats lines at its end).
func parseHeapProfile(data []byte) (goMemory, error) {
	var m goMemory
	fields := map[string]*int64{"# HeapInuse = ": &m.heap, "# HeapAlloc = ": &m.objects, "# Stack = ": &m.stack}
	found := 0
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		for prefix, dst := range fields {
			v, ok := strings.CutPrefix(sc.Text(), prefix)
			if !ok {
				continue
			}
			inuse, _, _ := strings.Cut(v, " /") // "# Stack = inuse / sys"
			n, err := strconv.ParseInt(strings.TrimSpace(inuse), 10, 64)
			if err != nil {
				return goMemory{}, fmt.Errorf("heap profile line %q: %w", sc.Text(), err)
			}
			*dst = n
			found++
		}
	}
	if found != len(fields) {
		return goMemory{}, errors.New("no HeapInuse, HeapAlloc and Stack in the heap profile")
	}
	return m, nil
}

// apiserverMemory forces a garbage collection in the apiserver (/debug/pprof/heap?gc=1, which needs the
// admin credentials the benchmark has) and returns its memory right after.
func apiserverMemory(ctx context.Context, rc *rest.Config, pid int) (goMemory, error) {
	data, err := apiserverGet(ctx, rc, "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return goMemory{}, err
	}
	m, err := parseHeapProfile(data)
	if err != nil {
		return m, fmt.Errorf("apiserver: %w", err)
	}
	m.rss, err = rss(pid)
	return m, err
}

// serverMemory does the same for dkc-server through its --profiling endpoint.
func serverMemory(ctx context.Context, metricsAddr string, pid int) (goMemory, error) {
	body, err := get(ctx, "http://"+metricsAddr+"/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return goMemory{}, err
	}
	data, err := io.ReadAll(body)
	body.Close()
	if err != nil {
		return goMemory{}, err
	}
	m, err := parseHeapProfile(data)
	if err != nil {
		return m, fmt.Errorf("dkc-server: %w", err)
	}
	m.rss, err = rss(pid)
	return m, err
}

// sampleMemory takes n samples of measure, every interval, and returns the median of each part: one
// collection can land in the middle of a burst of allocations, several rarely all do.
func sampleMemory(ctx context.Context, n int, interval time.Duration,
	measure func(context.Context) (goMemory, error)) (goMemory, error) {
	var rssS, heapS, objectsS, stackS []int64
	for i := range n {
		if i > 0 {
			select {
			case <-ctx.Done():
				return goMemory{}, ctx.Err()
			case <-time.After(interval):
			}
		}
		m, err := measure(ctx)
		if err != nil {
			return goMemory{}, err
		}
		rssS, heapS, objectsS, stackS =
			append(rssS, m.rss), append(heapS, m.heap), append(objectsS, m.objects), append(stackS, m.stack)
	}
	return goMemory{rss: median(rssS), heap: median(heapS), objects: median(objectsS), stack: median(stackS)}, nil
}

func median(v []int64) int64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// procCPU is the CPU time pid has used, user and system (fields 14 and 15 of /proc/<pid>/stat, in clock
// ticks of 1/100 s, USER_HZ on every Linux architecture Go supports here).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[i+1:])) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// get GETs url from dkc-server's metrics address and returns the body of a 200 response.
func get(ctx context.Context, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp.Body, nil
}

// serverMetrics reads dkc-server's /metrics.
func serverMetrics(ctx context.Context, addr string) (map[string]*dto.MetricFamily, error) {
	body, err := get(ctx, "http://"+addr+"/metrics")
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return metricFamilies(body)
}

// serverMetric reads one metric (summed over matching labels) from dkc-server's /metrics.
func serverMetric(ctx context.Context, addr, name string, match map[string]string) (float64, error) {
	families, err := serverMetrics(ctx, addr)
	if err != nil {
		return 0, err
	}
	return metricSum(families, name, match), nil
}

// percentile of sorted-in-place durations (nearest rank).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(float64(len(d))*p+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(d) {
		i = len(d) - 1
	}
	return d[i]
}

// fetch GETs url into path.
func fetch(ctx context.Context, url, path string) error {
	body, err := get(ctx, url)
	if err != nil {
		return err
	}
	defer body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// histogram is a Prometheus histogram's cumulative bucket counts by upper bound.
type histogram map[float64]float64

// histogramOf is histogram name, summed over the series whose labels include match.
func histogramOf(families map[string]*dto.MetricFamily, name string, match map[string]string) histogram {
	h := histogram{}
	for _, m := range matching(families, name, match) {
		for _, b := range m.GetHistogram().GetBucket() {
			h[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	return h
}

// serverDelays are dkc-server's histograms of where a Node change waits inside it: in the node queue for a
// worker, in the worker (resolution), and from the node's new state to its push.
type serverDelays struct{ queued, worked, pushed histogram }

// readServerDelays reads them from one scrape of dkc-server's /metrics.
func readServerDelays(ctx context.Context, addr string) (serverDelays, error) {
	families, err := serverMetrics(ctx, addr)
	if err != nil {
		return serverDelays{}, err
	}
	nodes := map[string]string{"name": "nodes"}
	return serverDelays{
		queued: histogramOf(families, "workqueue_queue_duration_seconds", nodes),
		worked: histogramOf(families, "workqueue_work_duration_seconds", nodes),
		pushed: histogramOf(families, "dkc_server_push_latency_seconds", nil),
	}, nil
}

// note records, as bucket upper bounds, the p50, p99 and largest of the observations since before.
func (d serverDelays) note(res *Results, prefix string, before serverDelays) {
	for _, h := range []struct {
		name          string
		after, before histogram
	}{
		{"queued", d.queued, before.queued},
		{"resolved", d.worked, before.worked},
		{"resolved_to_pushed", d.pushed, before.pushed},
	} {
		for _, q := range []struct {
			name string
			q    float64
		}{{"p50", 0.5}, {"p99", 0.99}, {"max", 1}} {
			// An observation past the top finite bucket is only known to be above that bound.
			if v, over := h.after.quantile(h.before, q.q); over {
				res.note(prefix+h.name+"_"+q.name+"_seconds_gt", v)
			} else {
				res.note(prefix+h.name+"_"+q.name+"_seconds_le", v)
			}
		}
	}
}

// quantile of the observations between before and h: the upper bound of the bucket holding it, or, when it
// lies past the largest finite bound (the +Inf bucket, which JSON cannot hold), that bound and over true.
// 0 when nothing was observed meanwhile.
func (h histogram) quantile(before histogram, q float64) (bound float64, over bool) {
	bounds := make([]float64, 0, len(h))
	for b := range h {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return 0, false
	}
	total := h[bounds[len(bounds)-1]] - before[bounds[len(bounds)-1]]
	if total <= 0 {
		return 0, false
	}
	finite := 0.0
	for _, b := range bounds {
		if math.IsInf(b, 1) {
			return finite, true
		}
		if h[b]-before[b] >= q*total {
			return b, false
		}
		finite = b
	}
	return finite, true
}

// runtimeStalls is what this process's Go runtime recorded about delays, cumulative: how long runnable
// goroutines waited for a thread (/sched/latencies) and how long the collector stopped the world
// (/sched/pauses/total/gc). The propagation phase takes one before and after each repetition: a stall of
// every dkc delivery that the scheduler shows here is the benchmark process's own (1,000 simulated
// sidecars on the same cores as the control plane), not dkc's.
type runtimeStalls struct{ sched, gc *metrics.Float64Histogram }

func readRuntimeStalls() runtimeStalls {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/sched/pauses/total/gc:seconds"}}
	metrics.Read(s)
	h := func(v metrics.Value) *metrics.Float64Histogram {
		if v.Kind() != metrics.KindFloat64Histogram {
			return nil
		}
		return v.Float64Histogram()
	}
	return runtimeStalls{sched: h(s[0].Value), gc: h(s[1].Value)}
}

// longestSince is the lower bound of the highest bucket that gained a count between before and after:
// the longest delay recorded meanwhile was at least this long. 0 when none was recorded.
func longestSince(before, after *metrics.Float64Histogram) float64 {
	if before == nil || after == nil || len(before.Counts) != len(after.Counts) {
		return 0
	}
	for i := len(after.Counts) - 1; i >= 0; i-- {
		if after.Counts[i] > before.Counts[i] {
			return max(after.Buckets[i], 0) // the first bucket's lower bound is -Inf
		}
	}
	return 0
}

// cpuProcesses are the cluster processes whose CPU time the fleet phase accounts, beside the benchmark's own
// (the simulated nodes and the bare client) and the machine's idle time: on a small machine they share its
// cores, and which one took them says whether dkc or the simulation held the apiserver back.
var cpuProcesses = []string{"kube-apiserver", "etcd", "dkc-server"}

// cpuTimes is CPU seconds used so far, by process name, with "bench" this process and "idle" the machine's
// idle time summed over its cores.
type cpuTimes map[string]float64

func (r *run) cpuTimes() cpuTimes {
	t := cpuTimes{}
	for _, name := range cpuProcesses {
		if pid, err := r.cluster.PID(name); err == nil && pid > 0 {
			if s, err := processCPU(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
				t[name] = s
			}
		}
	}
	if s, err := processCPU("/proc/self/stat"); err == nil {
		t["bench"] = s
	}
	if s, err := machineIdle("/proc/stat"); err == nil {
		t["idle"] = s
	}
	return t
}

// minus is the CPU seconds used between o and t, by name.
func (t cpuTimes) minus(o cpuTimes) cpuTimes {
	d := cpuTimes{}
	for k, v := range t {
		if ov, ok := o[k]; ok {
			d[k] = v - ov
		}
	}
	return d
}

// record notes the CPU seconds of a window under <prefix>_cpu_seconds_<name> and returns them as one line.
func (t cpuTimes) record(res *Results, prefix string) string {
	names := slices.Sorted(maps.Keys(t))
	var b strings.Builder
	for _, k := range names {
		res.note(prefix+"_cpu_seconds_"+strings.ReplaceAll(k, "-", "_"), t[k])
		fmt.Fprintf(&b, " %s %.1f s", k, t[k])
	}
	return strings.TrimSpace(b.String())
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux architecture Go supports.
const clockTicks = 100

// processCPU is the user + system CPU seconds of the process whose /proc/<pid>/stat is at path.
func processCPU(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: %d fields", path, len(f)+2)
	}
	user, err1 := strconv.ParseFloat(f[11], 64)
	sys, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return (user + sys) / clockTicks, nil
}

// machineIdle is the idle + iowait seconds of every core together, from /proc/stat's "cpu" line.
func machineIdle(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, fmt.Errorf("%s: no cpu line", path)
	}
	idle, err1 := strconv.ParseFloat(f[4], 64)
	iowait, err2 := strconv.ParseFloat(f[5], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return (idle + iowait) / clockTicks, nil
}

// profileSelf takes this process's CPU profile (the simulated nodes, or the bare client) into
// <Dir>/bench-<name>.cpu.pprof until the returned func is called; a no-op while -cpuprofile profiles the
// whole run (a process has one CPU profile at a time).
func (r *run) profileSelf(name string) (stop func()) {
	f, err := os.Create(filepath.Join(r.cfg.Dir, "bench-"+name+".cpu.pprof"))
	if err != nil {
		r.progress("profile %s: %v", name, err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			r.progress("profile %s: %v", name, err)
		}
	}
}
