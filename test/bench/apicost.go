// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// apiserverBreakdown is what the apiserver's own metrics say it did in one measured window, by request:
// where a window's CPU went, as far as the apiserver counts it. It has no per-request CPU figure: handling
// time (which includes waiting on etcd and on admission webhooks), response bytes (encoding) and watch
// events sent are what it measures instead.
type apiserverBreakdown struct {
	WindowSeconds float64 `json:"windowSeconds"`
	CPUSeconds    float64 `json:"cpuSeconds"`
	// RSSStartBytes is the apiserver's RSS at the window's start; RSSPeakBytes the most it reached in the
	// window (VmHWM, reset at the start), 0 where the kernel would not reset it.
	RSSStartBytes int64        `json:"rssStartBytes"`
	RSSPeakBytes  int64        `json:"rssPeakBytes,omitempty"`
	Requests      []requestRow `json:"requests"`
	// Flows are the requests by APF FlowSchema: who made them (dkc-server's own schema, service
	// accounts, or exempt: the benchmark's admin client and the apiserver's own) and how long they queued.
	Flows   []flowRow  `json:"flows"`
	Watches []watchRow `json:"watches"`
	Lists   []listRow  `json:"lists"`
	// Checked are the resources the apiserver's watch-cache consistency checker compared with etcd in
	// the window (apiserver_storage_consistency_checks_total): each check LISTs the resource from etcd
	// and from the cache, every 5 to 7.5 minutes, whoever is connected.
	Checked []string  `json:"consistencyChecked,omitempty"`
	Etcd    []etcdRow `json:"etcd"`
}

// requestRow is the requests of one verb on one resource (and subresource) in a window. A non-resource
// request (/metrics, /healthz) has no resource and its path as subresource, as the apiserver labels it.
type requestRow struct {
	Verb        string `json:"verb"`
	Resource    string `json:"resource,omitempty"`
	Subresource string `json:"subresource,omitempty"`
	// Requests counts those completed (apiserver_request_total), and for watches those started: the
	// completed plus the growth of those open (apiserver_longrunning_requests). Errors counts the
	// completed ones answered with other than 2xx, by code.
	Requests float64            `json:"requests"`
	Errors   map[string]float64 `json:"errors,omitempty"`
	// Seconds is their handling time summed (apiserver_request_duration_seconds_sum), queueing in API
	// Priority and Fairness included; none for watches, whose duration is how long they were open.
	Seconds float64 `json:"seconds"`
	// ResponseBytes is what they answered (apiserver_response_sizes_sum); none for watches, whose
	// figure is all a watch sent over its life (the window's events are in watchRow).
	ResponseBytes float64 `json:"responseBytes"`
}

// flowRow is the requests one APF FlowSchema classified in a window: dispatched
// (apiserver_flowcontrol_dispatched_requests_total) and rejected, the seconds they waited in its queues
// and the seconds they executed (apiserver_flowcontrol_request_{wait_duration,execution}_seconds_sum).
type flowRow struct {
	FlowSchema       string  `json:"flowSchema"`
	PriorityLevel    string  `json:"priorityLevel"`
	Dispatched       float64 `json:"dispatched"`
	Rejected         float64 `json:"rejected,omitempty"`
	WaitSeconds      float64 `json:"waitSeconds"`
	ExecutionSeconds float64 `json:"executionSeconds"`
}

func (r requestRow) name() string {
	switch {
	case r.Resource == "":
		return r.Verb + " " + cmp.Or(r.Subresource, "(non-resource)")
	case r.Subresource != "":
		return r.Verb + " " + r.Resource + "/" + r.Subresource
	}
	return r.Verb + " " + r.Resource
}

// watchRow is what watches on one resource were sent in a window: events (apiserver_watch_events_total)
// and their encoded bytes (apiserver_watch_events_sizes_sum), of which InitEvents were a new watch's
// initial state from the watch cache (apiserver_init_events_total: a watch-list informer's LIST).
type watchRow struct {
	Resource   string  `json:"resource"`
	Events     float64 `json:"events"`
	Bytes      float64 `json:"bytes"`
	InitEvents float64 `json:"initEvents"`
}

// listRow is the LISTs of one resource from one store (the watch cache or etcd) in a window and the
// objects they went through (apiserver_storage_list_*): a selector that matches one object still fetches
// every object its index cannot rule out.
type listRow struct {
	Resource string  `json:"resource"`
	Storage  string  `json:"storage"`
	Lists    float64 `json:"lists"`
	Fetched  float64 `json:"fetchedObjects"`
	Returned float64 `json:"returnedObjects"`
}

// etcdRow is the apiserver's requests to etcd of one operation on one resource (etcd_requests_total,
// etcd_request_duration_seconds_sum).
type etcdRow struct {
	Operation string  `json:"operation"`
	Resource  string  `json:"resource"`
	Requests  float64 `json:"requests"`
	Seconds   float64 `json:"seconds"`
}

// metricValue reads a counter, gauge or untyped sample; histogramSum a histogram's sum.
func metricValue(m *dto.Metric) float64 {
	return m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
}
func histogramSum(m *dto.Metric) float64 { return m.GetHistogram().GetSampleSum() }

// labelValues keys a series by the values of up to four labels.
type labelValues [4]string

// growth is how much family name grew between two scrapes, per combination of the values of labels (every
// other label summed over), as val reads each sample. A series absent before counts from 0; the apiserver
// is not restarted within a window, so its counters do not reset.
func growth(before, after map[string]*dto.MetricFamily, name string, val func(*dto.Metric) float64,
	labels ...string) map[labelValues]float64 {
	out := map[labelValues]float64{}
	for _, s := range []struct {
		families map[string]*dto.MetricFamily
		sign     float64
	}{{after, 1}, {before, -1}} {
		for _, m := range s.families[name].GetMetric() {
			var k labelValues
			for _, l := range m.GetLabel() {
				if i := slices.Index(labels, l.GetName()); i >= 0 {
					k[i] = l.GetValue()
				}
			}
			out[k] += s.sign * val(m)
		}
	}
	return out
}

// keys is the keys of every one of ms.
func keys(ms ...map[labelValues]float64) []labelValues {
	seen := map[labelValues]bool{}
	var out []labelValues
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

// longRunning verbs' durations are how long a request stayed open.
func longRunning(verb string) bool {
	return verb == "WATCH" || verb == "WATCHLIST" || verb == "CONNECT"
}

// breakdown computes a window's apiserverBreakdown from the apiserver's metrics at its start and end.
// Rows are sorted by their cost: handling time, bytes sent, objects fetched.
func breakdown(before, after map[string]*dto.MetricFamily) apiserverBreakdown {
	var b apiserverBreakdown
	req := []string{"verb", "resource", "subresource"}
	total := growth(before, after, "apiserver_request_total", metricValue, req...)
	opened := growth(before, after, "apiserver_longrunning_requests", metricValue, req...)
	codes := growth(before, after, "apiserver_request_total", metricValue, append(req[:3:3], "code")...)
	seconds := growth(before, after, "apiserver_request_duration_seconds", histogramSum, req...)
	bytes := growth(before, after, "apiserver_response_sizes", histogramSum, req...)
	// A watch opened in the window and still open has no completed request yet.
	for _, k := range keys(total, opened) {
		row := requestRow{Verb: k[0], Resource: k[1], Subresource: k[2], Requests: total[k]}
		if longRunning(row.Verb) {
			row.Requests += opened[k]
		} else {
			row.Seconds, row.ResponseBytes = seconds[k], bytes[k]
		}
		if row.Requests <= 0 {
			continue
		}
		for c, v := range codes {
			if c[0] == k[0] && c[1] == k[1] && c[2] == k[2] && v > 0 && !strings.HasPrefix(c[3], "2") {
				if row.Errors == nil {
					row.Errors = map[string]float64{}
				}
				row.Errors[c[3]] += v
			}
		}
		b.Requests = append(b.Requests, row)
	}
	slices.SortFunc(b.Requests, func(x, y requestRow) int {
		return cmp.Or(cmp.Compare(y.Seconds, x.Seconds), cmp.Compare(y.ResponseBytes, x.ResponseBytes),
			cmp.Compare(y.Requests, x.Requests), strings.Compare(x.name(), y.name()))
	})

	flow := []string{"flow_schema", "priority_level"}
	dispatched := growth(before, after, "apiserver_flowcontrol_dispatched_requests_total", metricValue, flow...)
	rejected := growth(before, after, "apiserver_flowcontrol_rejected_requests_total", metricValue, flow...)
	wait := growth(before, after, "apiserver_flowcontrol_request_wait_duration_seconds", histogramSum, flow...)
	execution := growth(before, after, "apiserver_flowcontrol_request_execution_seconds", histogramSum, flow...)
	for _, k := range keys(dispatched, rejected) {
		if dispatched[k] > 0 || rejected[k] > 0 {
			b.Flows = append(b.Flows, flowRow{FlowSchema: k[0], PriorityLevel: k[1], Dispatched: dispatched[k],
				Rejected: rejected[k], WaitSeconds: wait[k], ExecutionSeconds: execution[k]})
		}
	}
	slices.SortFunc(b.Flows, func(x, y flowRow) int {
		return cmp.Or(cmp.Compare(y.WaitSeconds+y.ExecutionSeconds, x.WaitSeconds+x.ExecutionSeconds),
			cmp.Compare(y.Dispatched, x.Dispatched), strings.Compare(x.FlowSchema, y.FlowSchema))
	})

	events := growth(before, after, "apiserver_watch_events_total", metricValue, "resource")
	eventBytes := growth(before, after, "apiserver_watch_events_sizes", histogramSum, "resource")
	initEvents := growth(before, after, "apiserver_init_events_total", metricValue, "resource")
	resources := map[string]bool{}
	for _, m := range []map[labelValues]float64{events, initEvents} {
		for k, v := range m {
			if v > 0 {
				resources[k[0]] = true
			}
		}
	}
	for res := range resources {
		k := labelValues{res}
		b.Watches = append(b.Watches,
			watchRow{Resource: res, Events: events[k], Bytes: eventBytes[k], InitEvents: initEvents[k]})
	}
	slices.SortFunc(b.Watches, func(x, y watchRow) int {
		return cmp.Or(cmp.Compare(y.Bytes, x.Bytes), cmp.Compare(y.Events+y.InitEvents, x.Events+x.InitEvents),
			strings.Compare(x.Resource, y.Resource))
	})

	lists := growth(before, after, "apiserver_storage_list_total", metricValue, "resource", "storage")
	fetched := growth(before, after, "apiserver_storage_list_fetched_objects_total", metricValue, "resource", "storage")
	returned := growth(before, after, "apiserver_storage_list_returned_objects_total", metricValue, "resource", "storage")
	for k, n := range lists {
		if n > 0 {
			b.Lists = append(b.Lists, listRow{Resource: k[0], Storage: k[1], Lists: n, Fetched: fetched[k],
				Returned: returned[k]})
		}
	}
	slices.SortFunc(b.Lists, func(x, y listRow) int {
		return cmp.Or(cmp.Compare(y.Fetched, x.Fetched), cmp.Compare(y.Lists, x.Lists),
			strings.Compare(x.Resource, y.Resource), strings.Compare(x.Storage, y.Storage))
	})

	for k, n := range growth(before, after, "apiserver_storage_consistency_checks_total", metricValue, "resource") {
		if n > 0 {
			b.Checked = append(b.Checked, k[0])
		}
	}
	slices.Sort(b.Checked)

	etcdN := growth(before, after, "etcd_requests_total", metricValue, "operation", "resource")
	etcdS := growth(before, after, "etcd_request_duration_seconds", histogramSum, "operation", "resource")
	for k, n := range etcdN {
		if n > 0 {
			b.Etcd = append(b.Etcd, etcdRow{Operation: k[0], Resource: k[1], Requests: n, Seconds: etcdS[k]})
		}
	}
	slices.SortFunc(b.Etcd, func(x, y etcdRow) int {
		return cmp.Or(cmp.Compare(y.Seconds, x.Seconds), cmp.Compare(y.Requests, x.Requests),
			strings.Compare(x.Operation+x.Resource, y.Operation+y.Resource))
	})
	return b
}

// apiserverWindow is a measured window of the apiserver: its metrics, CPU time and RSS at the start, and
// its CPU profile of the window's first apiserverProfile.
type apiserverWindow struct {
	pid       int
	start     time.Time
	metrics   map[string]*dto.MetricFamily
	cpu       time.Duration
	rss       int64
	peakReset bool
	profiled  chan struct{}
}

// apiserverProfile is how long the apiserver's CPU profile of a window runs: the burst at its start (the
// connections, the informers' initial events). Shorter than every window measured (45–75 s here), so that
// it never reaches the forced collections measured after one.
const apiserverProfile = 30 * time.Second

// startWindow scrapes the apiserver (pid), resets its peak RSS, and starts its CPU profile into
// <Dir>/apiserver-<name>.cpu.pprof. The scrape comes before the CPU reading, so that its own cost is not
// the window's.
func (r *run) startWindow(ctx context.Context, pid int, name string) (*apiserverWindow, error) {
	w := &apiserverWindow{pid: pid, profiled: make(chan struct{})}
	var err error
	if w.metrics, err = r.apiserverMetrics(ctx); err != nil {
		return nil, fmt.Errorf("scrape the apiserver at a window's start: %w", err)
	}
	// Writing 5 to clear_refs resets VmHWM to the current RSS (Linux 4.0; root): the window's peak, not
	// the process's since it started. Nothing else in the benchmark reads the apiserver's VmHWM.
	w.peakReset = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) == nil
	w.rss, _ = rss(pid)
	if w.cpu, err = procCPU(pid); err != nil {
		return nil, err
	}
	w.start = time.Now()
	go func() {
		defer close(w.profiled)
		data, err := apiserverGet(ctx, r.rc, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(apiserverProfile.Seconds())))
		if err == nil {
			err = os.WriteFile(filepath.Join(r.cfg.Dir, "apiserver-"+name+".cpu.pprof"), data, 0o644)
		}
		if err != nil {
			r.progress("apiserver profile %s: %v", name, err)
		}
	}()
	return w, nil
}

// end reads the apiserver's CPU time and peak RSS, then scrapes it, and returns the window's breakdown. It
// waits for the window's profile first (in a window shorter than apiserverProfile, past its end).
func (w *apiserverWindow) end(ctx context.Context, r *run) (apiserverBreakdown, error) {
	<-w.profiled
	cpu, err := procCPU(w.pid)
	if err != nil {
		return apiserverBreakdown{}, err
	}
	took := time.Since(w.start)
	var peak int64
	if w.peakReset {
		peak, _ = peakRSS(w.pid)
	}
	after, err := r.apiserverMetrics(ctx)
	if err != nil {
		return apiserverBreakdown{}, fmt.Errorf("scrape the apiserver at a window's end: %w", err)
	}
	b := breakdown(w.metrics, after)
	b.WindowSeconds, b.CPUSeconds = took.Seconds(), (cpu - w.cpu).Seconds()
	b.RSSStartBytes, b.RSSPeakBytes = w.rss, peak
	return b, nil
}

// breakdownComparison is a window of dkc and one of the per-kubelet-watch design, side by side.
type breakdownComparison struct {
	Name   string             `json:"name"`
	DKC    apiserverBreakdown `json:"dkc"`
	Design apiserverBreakdown `json:"design"`
}

// breakdownRows is how many request rows the table shows, and subRows how many of each smaller table's;
// the rest are summed in one row. results.json has them all.
const (
	breakdownRows = 15
	subRows       = 6
)

// print writes the comparison as tables: requests (the costliest by handling time in either window), by
// FlowSchema, watch events sent, LISTs by store, and etcd requests.
func (c breakdownComparison) print(w io.Writer) {
	fmt.Fprintf(w, "\napiserver by request, %s (dkc: dkc-server's restart until every node is served, plus %v idle; "+
		"design: the per-node informers' start until synced, plus %v idle, dkc-server still serving)\n",
		c.Name, idleWindow, idleWindow)
	for _, d := range []struct {
		name string
		b    apiserverBreakdown
	}{{"dkc", c.DKC}, {"design", c.Design}} {
		fmt.Fprintf(w, "%s: window %.1f s, apiserver CPU %.2f s, RSS %s at the start, peak %s", d.name, d.b.WindowSeconds,
			d.b.CPUSeconds, mib(d.b.RSSStartBytes), mib(d.b.RSSPeakBytes))
		if len(d.b.Checked) > 0 {
			fmt.Fprintf(w, "; the watch cache's consistency check listed %s", strings.Join(d.b.Checked, ", "))
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	side(tw, []string{"REQUEST", "N", "ERRORS", "SECONDS", "RESPONSE"}, c.DKC.Requests, c.Design.Requests, breakdownRows,
		requestRow.name, func(r requestRow) float64 { return r.Seconds }, func(r requestRow) []string {
			codes := make([]string, 0, len(r.Errors))
			for _, code := range slices.Sorted(maps.Keys(r.Errors)) {
				codes = append(codes, fmt.Sprintf("%.0f×%s", r.Errors[code], code))
			}
			return []string{count(r.Requests), strings.Join(codes, " "), fmt.Sprintf("%.2f", r.Seconds), size(r.ResponseBytes)}
		}, func(a, b requestRow) requestRow {
			a.Requests += b.Requests
			a.Seconds += b.Seconds
			a.ResponseBytes += b.ResponseBytes
			for code, n := range b.Errors {
				if a.Errors == nil {
					a.Errors = map[string]float64{}
				}
				a.Errors[code] += n
			}
			return a
		})
	side(tw, []string{"FLOWSCHEMA", "DISPATCHED", "REJECTED", "WAITED S", "EXECUTED S"}, c.DKC.Flows, c.Design.Flows,
		subRows,
		func(r flowRow) string { return r.FlowSchema }, func(r flowRow) float64 { return r.WaitSeconds + r.ExecutionSeconds },
		func(r flowRow) []string {
			return []string{count(r.Dispatched), count(r.Rejected), fmt.Sprintf("%.2f", r.WaitSeconds),
				fmt.Sprintf("%.2f", r.ExecutionSeconds)}
		}, func(a, b flowRow) flowRow {
			a.Dispatched += b.Dispatched
			a.Rejected += b.Rejected
			a.WaitSeconds += b.WaitSeconds
			a.ExecutionSeconds += b.ExecutionSeconds
			return a
		})
	side(tw, []string{"WATCH EVENTS SENT", "EVENTS", "INITIAL", "BYTES", ""}, c.DKC.Watches, c.Design.Watches, subRows,
		func(r watchRow) string { return r.Resource }, func(r watchRow) float64 { return r.Bytes },
		func(r watchRow) []string { return []string{count(r.Events), count(r.InitEvents), size(r.Bytes), ""} },
		func(a, b watchRow) watchRow {
			a.Events += b.Events
			a.InitEvents += b.InitEvents
			a.Bytes += b.Bytes
			return a
		})
	side(tw, []string{"LIST (STORE)", "LISTS", "FETCHED", "RETURNED", ""}, c.DKC.Lists, c.Design.Lists, subRows,
		func(r listRow) string { return r.Resource + " (" + r.Storage + ")" }, func(r listRow) float64 { return r.Fetched },
		func(r listRow) []string { return []string{count(r.Lists), count(r.Fetched), count(r.Returned), ""} },
		func(a, b listRow) listRow {
			a.Lists += b.Lists
			a.Fetched += b.Fetched
			a.Returned += b.Returned
			return a
		})
	side(tw, []string{"ETCD REQUEST", "N", "SECONDS", "", ""}, c.DKC.Etcd, c.Design.Etcd, subRows,
		func(r etcdRow) string { return r.Operation + " " + r.Resource }, func(r etcdRow) float64 { return r.Seconds },
		func(r etcdRow) []string { return []string{count(r.Requests), fmt.Sprintf("%.2f", r.Seconds), "", ""} },
		func(a, b etcdRow) etcdRow {
			a.Requests += b.Requests
			a.Seconds += b.Seconds
			return a
		})
	tw.Flush()
}

// side writes one table of both windows' rows side by side: a header (the key's, then the four cells'
// headings, under dkc and again under design), the top rows by the larger cost of the two windows, the
// rest added up into one row, and the sum of all.
func side[T any](tw io.Writer, header []string, dkc, design []T, top int, key func(T) string, cost func(T) float64,
	cells func(T) []string, add func(T, T) T) {
	h := append([]string{header[0]}, append(prefixed("dkc ", header[1:]), prefixed("design ", header[1:])...)...)
	fmt.Fprintln(tw, strings.Join(h, "\t")+"\t")
	keys := union(dkc, design, key)
	a, b := index(dkc, key), index(design, key)
	slices.SortStableFunc(keys, func(x, y string) int {
		return cmp.Compare(max(cost(a[y]), cost(b[y])), max(cost(a[x]), cost(b[x])))
	})
	line := func(name string, x, y T, present [2]bool) {
		row := []string{name}
		for i, r := range []T{x, y} {
			if present[i] {
				row = append(row, cells(r)...)
			} else {
				row = append(row, "-", "", "", "")
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	var rest, all [2]T
	var restPresent, allPresent [2]bool
	for i, k := range keys {
		x, inA := a[k]
		y, inB := b[k]
		all[0], all[1] = add(all[0], x), add(all[1], y)
		allPresent[0], allPresent[1] = allPresent[0] || inA, allPresent[1] || inB
		if i < top {
			line(k, x, y, [2]bool{inA, inB})
			continue
		}
		rest[0], rest[1] = add(rest[0], x), add(rest[1], y)
		restPresent[0], restPresent[1] = restPresent[0] || inA, restPresent[1] || inB
	}
	if len(keys) > top {
		line(fmt.Sprintf("%d more", len(keys)-top), rest[0], rest[1], restPresent)
		line("all", all[0], all[1], allPresent)
	}
}

func prefixed(p string, s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		if v != "" {
			out[i] = p + v
		}
	}
	// Only the first heading of each side says whose it is.
	for i := 1; i < len(out); i++ {
		out[i] = strings.TrimPrefix(out[i], p)
	}
	return out
}

// union is the keys of both windows' rows, in the first's order, then the second's new ones.
func union[T any](a, b []T, key func(T) string) []string {
	var out []string
	seen := map[string]bool{}
	for _, rows := range [][]T{a, b} {
		for _, r := range rows {
			if k := key(r); !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

func index[T any](rows []T, key func(T) string) map[string]T {
	m := make(map[string]T, len(rows))
	for _, r := range rows {
		m[key(r)] = r
	}
	return m
}

func count(n float64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%.0f", n)
}

func size(b float64) string {
	switch {
	case b == 0:
		return ""
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

func mib(b int64) string {
	if b == 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}
