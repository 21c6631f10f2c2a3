package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"k8s.io/client-go/rest"
)

// rss is the resident set size of pid in bytes (VmRSS of /proc/<pid>/status).
func rss(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// settledRSS samples pid's RSS for d and returns the last sample: Go processes release memory lazily, so a
// single sample right after a burst overstates what stays.
func settledRSS(ctx context.Context, pid int, d time.Duration) (int64, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	return rss(pid)
}

// metricSum adds up the samples of the named metric whose labels include every pair in match.
func metricSum(body io.Reader, name string, match map[string]string) (float64, error) {
	var p expfmt.TextParser
	families, err := p.TextToMetricFamilies(body)
	if err != nil {
		return 0, fmt.Errorf("parse metrics: %w", err)
	}
	mf, ok := families[name]
	if !ok {
		return 0, nil
	}
	var sum float64
	for _, m := range mf.GetMetric() {
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
		if !ok {
			continue
		}
		switch {
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, nil
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
	total := 0
	for _, resource := range []string{"nodes", "configmaps"} {
		n, err := metricSum(strings.NewReader(string(data)), "apiserver_longrunning_requests", map[string]string{"verb": "WATCH", "resource": resource})
		if err != nil {
			return 0, err
		}
		total += int(n)
	}
	return total, nil
}

// apiserverLiveHeap forces a garbage collection in the apiserver and returns its heap in use
// (/debug/pprof/heap?gc=1, which needs the admin credentials the benchmark has).
func apiserverLiveHeap(ctx context.Context, rc *rest.Config) (int64, error) {
	data, err := apiserverGet(ctx, rc, "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapInuse = "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("no HeapInuse in the apiserver's heap profile")
}

// serverMetric reads one metric (summed over matching labels) from dkc-server's /metrics.
func serverMetric(ctx context.Context, addr, name string, match map[string]string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET dkc-server /metrics: %w", err)
	}
	defer resp.Body.Close()
	return metricSum(resp.Body, name, match)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// histogram is a Prometheus histogram's cumulative bucket counts by upper bound.
type histogram map[float64]float64

// serverHistogram reads a histogram from dkc-server's /metrics.
func serverHistogram(ctx context.Context, addr, name string) (histogram, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	h := histogram{}
	if mf, ok := families[name]; ok {
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				h[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
	}
	return h, nil
}

// quantile of the observations between before and h: the upper bound of the bucket holding it.
func (h histogram) quantile(before histogram, q float64) float64 {
	bounds := make([]float64, 0, len(h))
	for b := range h {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	total := 0.0
	if len(bounds) > 0 {
		total = h[bounds[len(bounds)-1]] - before[bounds[len(bounds)-1]]
	}
	for _, b := range bounds {
		if h[b]-before[b] >= q*total {
			return b
		}
	}
	return 0
}
