// SPDX-License-Identifier: Apache-2.0

package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dkc-dev/dkc/internal/configcheck"
)

// TestNewServerBuildsEveryPartWithoutContactingAnything: construction is pure wiring, in dependency order;
// nothing is dialled or listened on before Run, and every gauge reads a part that exists.
func TestNewServerBuildsEveryPartWithoutContactingAnything(t *testing.T) {
	cfg := unconnectedConfig(t)
	s, err := newServer(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	families, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, name := range []string{"dkc_server_watched_configmaps", "dkc_server_resolved_nodes", "dkc_server_resolved_configs", "dkc_server_reported_nodes"} {
		if !got[name] {
			t.Errorf("gauge %s not registered", name)
		}
	}
	if s.svc.Serving("n1") {
		t.Error("a node is served before any stream opened")
	}
}

// TestElectRunsOneLeadAtATime: two replicas compete for one Lease (a fake clientset's); only one runs its
// lead, and when it shuts down (ReleaseOnCancel) the other takes over well within a lease duration.
func TestElectRunsOneLeadAtATime(t *testing.T) {
	client := fake.NewClientset()
	cfg := DefaultConfig()
	cfg.Namespace = "dkc"
	cfg.LeaderElectionLeaseDuration, cfg.LeaderElectionRenewDeadline, cfg.LeaderElectionRetryPeriod = 10*time.Second, 500*time.Millisecond, 100*time.Millisecond
	var running, maxRunning atomic.Int32
	started := make(chan string, 2)
	lead := func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			n := running.Add(1)
			for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
			}
			started <- name
			<-ctx.Done()
			running.Add(-1)
			return nil
		}
	}
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go func() { doneA <- elect(ctxA, client.CoordinationV1(), cfg, "a", zap.NewNop(), lead("a")) }()
	if got := waitStarted(t, started); got != "a" {
		t.Fatalf("%s leads, want a (alone)", got)
	}
	go func() { doneB <- elect(ctxB, client.CoordinationV1(), cfg, "b", zap.NewNop(), lead("b")) }()
	select {
	case got := <-started:
		t.Fatalf("%s leads while a holds the Lease", got)
	case <-time.After(time.Second): // proves a negative: b does not lead while a holds the Lease
	}
	stopA()
	if err := <-doneA; err != nil {
		t.Fatalf("a: %v", err)
	}
	// Released on cancel: b need not wait out a's 10s lease.
	if got := waitStarted(t, started); got != "b" {
		t.Fatalf("%s leads after a stopped, want b", got)
	}
	if m := maxRunning.Load(); m != 1 {
		t.Errorf("%d leads ran at once, want 1", m)
	}
	lease, err := client.CoordinationV1().Leases("dkc").Get(context.Background(), cfg.LeaderElectionID, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "b" {
		t.Errorf("lease dkc/%s: %+v (%v), want held by b", cfg.LeaderElectionID, lease.Spec, err)
	}
	stopB()
	if err := <-doneB; err != nil {
		t.Fatalf("b: %v", err)
	}
}

func waitStarted(t *testing.T, started <-chan string) string {
	t.Helper()
	select {
	case name := <-started:
		return name
	case <-time.After(5 * time.Second):
		t.Fatal("no replica leads within 5s")
		return ""
	}
}

// TestElectKeepsTheLeaseUntilTheLeadReturns: on shutdown the lead may still be finishing a Node patch;
// the Lease is released only after it returned, or the next leader would sync alongside it. Then it is
// released (the other replica need not wait out the lease duration). A replica that never led does not
// log that its controller stopped.
func TestElectKeepsTheLeaseUntilTheLeadReturns(t *testing.T) {
	client := fake.NewClientset()
	cfg := DefaultConfig()
	cfg.Namespace = "dkc"
	cfg.LeaderElectionLeaseDuration, cfg.LeaderElectionRenewDeadline, cfg.LeaderElectionRetryPeriod = 10*time.Second, 500*time.Millisecond, 100*time.Millisecond
	holder := func() string {
		l, err := client.CoordinationV1().Leases("dkc").Get(context.Background(), cfg.LeaderElectionID, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	started := make(chan struct{})
	var heldWhileStopping atomic.Bool
	lead := func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		// In flight: a patch that takes a while; the Lease must stay held meanwhile.
		held := true
		for range 5 {
			time.Sleep(50 * time.Millisecond) // the patch's time, which proves a negative: no release meanwhile
			held = held && holder() == "a"
		}
		heldWhileStopping.Store(held)
		return nil
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- elect(ctx, client.CoordinationV1(), cfg, "a", zap.NewNop(), lead) }()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("a never leads")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !heldWhileStopping.Load() {
		t.Error("the Lease was released while the lead was still stopping")
	}
	if h := holder(); h != "" {
		t.Errorf("lease held by %q after elect returned, want released", h)
	}

	// A replica that never leads (the Lease is held by someone else) logs no "controller stopped".
	other := "z"
	lease, err := client.CoordinationV1().Leases("dkc").Get(context.Background(), cfg.LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewMicroTime(time.Now())
	secs := int32(600)
	lease.Spec.HolderIdentity, lease.Spec.AcquireTime, lease.Spec.RenewTime, lease.Spec.LeaseDurationSeconds = &other, &now, &now, &secs
	if _, err := client.CoordinationV1().Leases("dkc").Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	ctx, stop = context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer stop()
	if err := elect(ctx, client.CoordinationV1(), cfg, "b", zap.New(core), func(context.Context) error { t.Error("b leads"); return nil }); err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessage("not leading: kubeletconfigpool controller stopped").Len(); n != 0 {
		t.Errorf("a replica that never led logged %d times that its controller stopped", n)
	}
}

// TestKubeletCheckers: --kubelet-config-checkers finds the helpers in the directory it names, fails on a
// named directory without them, turns the check off with "none", and without a value looks beside the
// executable (here the test binary, with no helpers beside it: a warning, no check).
func TestKubeletCheckers(t *testing.T) {
	withHelper := t.TempDir()
	if err := os.WriteFile(filepath.Join(withHelper, configcheck.HelperPrefix+"1.37"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		check     bool   // a checker returned
		wantErr   string // from a start that must fail
		wantLog   string
	}{
		{name: "named directory with helpers", dir: withHelper, check: true, wantLog: "are checked"},
		{name: "named directory without", dir: t.TempDir(), wantErr: "--kubelet-config-checkers: kubelet config checkers: no dkc-kubelet-check-<minor>"},
		{name: "none", dir: "none", wantLog: "--kubelet-config-checkers=none"},
		{name: "default, none beside the binary", dir: "", wantLog: "are not checked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			s := &server{cfg: Config{KubeletConfigCheckers: tc.dir}, log: zap.New(core)}
			c, err := s.kubeletCheckers()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (c != nil) != tc.check {
				t.Errorf("checker %v, want one: %v", c, tc.check)
			}
			if logs.FilterMessageSnippet(tc.wantLog).Len() != 1 {
				t.Errorf("no log line with %q: %v", tc.wantLog, logs.All())
			}
		})
	}
}

// TestMetricsAddressGuarded: with the default --metrics-auth the metrics address serves /metrics and the
// profiles to no caller without a token, and the probe paths to anyone; --metrics-auth=false builds no guard.
func TestMetricsAddressGuarded(t *testing.T) {
	cfg := unconnectedConfig(t)
	s, err := newServer(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if s.metricsGuard == nil || s.metricsGuard.TLS() == nil {
		t.Fatal("no guard (or no TLS) on the metrics address by default")
	}
	h := s.metricsGuard.Handler(metricsMux(s.reg, func() bool { return true }, true))
	for path, want := range map[string]int{"/metrics": 401, "/debug/pprof/": 401, "/healthz": 200, "/readyz": 200} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != want {
			t.Errorf("GET %s without a token: %d, want %d", path, w.Code, want)
		}
	}
	cfg.MetricsAuth.Auth = false
	if s, err = newServer(cfg, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if s.metricsGuard != nil {
		t.Error("--metrics-auth=false built a guard")
	}
}

// unconnectedConfig is the default config with a kubeconfig naming an apiserver nothing listens at:
// construction must not contact it.
func unconnectedConfig(t *testing.T) Config {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Kubeconfig, cfg.Insecure = kubeconfig, true
	return cfg
}
