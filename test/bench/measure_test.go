// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/durable"
)

func TestParseHeapProfile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    goMemory
		wantErr bool
	}{
		{name: "runtime.MemStats lines", in: "heap profile: 1: 2 [3: 4] @ heap/1048576\n\n# runtime.MemStats\n# Alloc = 10\n# HeapAlloc = 3000\n# HeapInuse = 4096\n# Stack = 8192 / 16384\n# MSpan = 1 / 2\n",
			want: goMemory{heap: 4096, objects: 3000, stack: 8192}},
		{name: "no stack line", in: "# HeapAlloc = 3000\n# HeapInuse = 4096\n", wantErr: true},
		{name: "no HeapAlloc line", in: "# HeapInuse = 4096\n# Stack = 8192 / 16384\n", wantErr: true},
		{name: "not a number", in: "# HeapAlloc = x\n# HeapInuse = 4096\n# Stack = 8192 / 16384\n", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseHeapProfile([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("parseHeapProfile = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestProcCPU(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) { // spend some CPU
	}
	d, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 || d > time.Hour {
		t.Errorf("procCPU = %v after spinning 50ms", d)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []int64
		want int64
	}{{[]int64{3}, 3}, {[]int64{5, 1, 3}, 3}, {[]int64{-2, 10, 4, 4}, 4}} {
		in := append([]int64(nil), tc.in...)
		if got := median(in); got != tc.want {
			t.Errorf("median(%v) = %d, want %d", tc.in, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.in[i] {
				t.Errorf("median reordered its input: %v", in)
			}
		}
	}
}

func TestReadDeployment(t *testing.T) {
	d, err := readDeployment(filepath.Join("..", "..", "deploy", "base", "server.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if d.limit <= 0 || d.goMemLimit == "" {
		t.Errorf("readDeployment = %+v, want a memory limit and a GOMEMLIMIT", d)
	}
	args := strings.Join(d.serviceArgs(), " ")
	if !strings.Contains(args, "--allowed-service-accounts=") || strings.Contains(args, "--listen-address") || !strings.HasSuffix(args, strings.Join(benchOnlyArgs, " ")) {
		t.Errorf("serviceArgs = %s, want the Deployment's own flags without its ports and files, then the benchmark's", args)
	}
	path := filepath.Join(t.TempDir(), "server.yaml")
	if err := os.WriteFile(path, []byte("args:\n  - --listen-address=:9443\n  - --kube-api-qps=7 # why\nresources:\n  limits: {memory: 1Gi}\nenv:\n  - name: GOMEMLIMIT\n    value: 900MiB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d, err = readDeployment(path); err != nil || d.limit != 1<<30 || d.goMemLimit != "900MiB" || d.goGC != "" ||
		!slices.Equal(d.serviceArgs(), append([]string{"--kube-api-qps=7"}, benchOnlyArgs...)) {
		t.Errorf("readDeployment = %+v, %v; want 1Gi, 900MiB, no GOGC and args --kube-api-qps=7", d, err)
	}
	if err := os.WriteFile(path, []byte("args:\n  - --a\nresources:\n  limits: {memory: 1Gi}\nenv:\n  - name: GOMEMLIMIT\n    value: 900MiB\n  - name: GOGC\n    value: \"50\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d, err = readDeployment(path); err != nil || d.goGC != "50" {
		t.Errorf("readDeployment = %+v, %v; want GOGC 50", d, err)
	}
}

// TestFsyncCostCountsEveryFsync checks that the simulated disk charges a durable write exactly once per
// fsync it makes: WriteFile makes two (file, directory), WriteDir one per file plus two, MkdirAll one per
// directory it creates.
func TestFsyncCostCountsEveryFsync(t *testing.T) {
	var charged int
	durable.SetFault(fsyncCost([]time.Duration{time.Millisecond}, func(time.Duration) { charged++ }))
	t.Cleanup(func() { durable.SetFault(nil) })
	dir := t.TempDir()
	for _, tc := range []struct {
		name   string
		write  func() error
		fsyncs int
	}{
		{"WriteFile", func() error { return durable.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644) }, 2},
		{"WriteFile replacing a file", func() error { return durable.WriteFile(filepath.Join(dir, "f"), []byte("y"), 0o644) }, 2},
		{"WriteDir with 3 files", func() error {
			return durable.WriteDir(filepath.Join(dir, "d"), map[string][]byte{"a": nil, "b": nil, "c": nil}, 0o644)
		}, 5},
		{"MkdirAll of 2 new directories", func() error { return durable.MkdirAll(filepath.Join(dir, "x", "y"), 0o755) }, 2},
		{"MkdirAll of an existing directory", func() error { return durable.MkdirAll(filepath.Join(dir, "x", "y"), 0o755) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			charged = 0
			if err := tc.write(); err != nil {
				t.Fatal(err)
			}
			if charged != tc.fsyncs {
				t.Errorf("charged %d fsyncs, want %d", charged, tc.fsyncs)
			}
		})
	}
}

func TestLongestSince(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0.001, 0.01, 0.1, 1}
	h := func(counts ...uint64) *metrics.Float64Histogram {
		return &metrics.Float64Histogram{Counts: counts, Buckets: buckets}
	}
	for _, tc := range []struct {
		name          string
		before, after *metrics.Float64Histogram
		want          float64
	}{
		{name: "nothing recorded", before: h(1, 2, 3, 4), after: h(1, 2, 3, 4), want: 0},
		{name: "short delays only", before: h(1, 2, 3, 4), after: h(9, 2, 3, 4), want: 0},
		{name: "the highest bucket that grew", before: h(1, 2, 3, 4), after: h(5, 9, 4, 4), want: 0.01},
		{name: "a long delay before does not count", before: h(0, 0, 0, 7), after: h(0, 3, 0, 7), want: 0.001},
		{name: "the last bucket", before: h(0, 0, 0, 0), after: h(0, 0, 0, 1), want: 0.1},
		{name: "no histogram", before: nil, after: h(0, 0, 0, 1), want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := longestSince(tc.before, tc.after); got != tc.want {
				t.Errorf("longestSince = %v, want %v", got, tc.want)
			}
		})
	}
	if s := readRuntimeStalls(); s.sched == nil || s.gc == nil {
		t.Errorf("readRuntimeStalls = %+v: the runtime no longer has these metrics", s)
	}
}

func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	before := histogram{0.001: 5, 0.01: 5, 0.1: 5, inf: 5}
	tests := []struct {
		name     string
		after    histogram
		q        float64
		want     float64
		wantOver bool
	}{
		{"nothing observed", histogram{0.001: 5, 0.01: 5, 0.1: 5, inf: 5}, 1, 0, false},
		{"median in the first bucket", histogram{0.001: 8, 0.01: 9, 0.1: 10, inf: 10}, 0.5, 0.001, false},
		{"max in the last finite bucket", histogram{0.001: 8, 0.01: 9, 0.1: 10, inf: 10}, 1, 0.1, false},
		{"max past the finite buckets", histogram{0.001: 8, 0.01: 9, 0.1: 9, inf: 10}, 1, 0.1, true},
		{"p99 of 100 with one outlier", histogram{0.001: 104, 0.01: 104, 0.1: 104, inf: 105}, 0.99, 0.001, false},
		{"no +Inf bucket", histogram{0.001: 6}, 1, 0.001, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := before
			if _, ok := tt.after[inf]; !ok {
				b = histogram{0.001: 5}
			}
			got, over := tt.after.quantile(b, tt.q)
			if got != tt.want || over != tt.wantOver {
				t.Errorf("quantile(%v) = %v, over %v; want %v, over %v", tt.q, got, over, tt.want, tt.wantOver)
			}
		})
	}
}

// TestNoteKeepsJSONWritable: a non-finite note must not cost the run its results.json.
func TestNoteKeepsJSONWritable(t *testing.T) {
	r := newResults()
	r.note("a", math.Inf(1))
	r.note("b", 0.5)
	if _, err := r.WriteJSON(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if r.Notes["a_not_finite"] != 1 || r.Notes["b"] != 0.5 {
		t.Errorf("notes = %v", r.Notes)
	}
}
