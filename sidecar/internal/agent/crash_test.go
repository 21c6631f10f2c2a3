// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/internal/poll"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/sidecar/internal/checkpoint"
	"github.com/dkc-dev/dkc/sidecar/internal/kubeletunit"
)

var crashSteps = flag.Int("crash-steps", 1000, "assignment steps of TestCrashConsistency (the long variant: -crash-steps=20000)")

// TestCrashConsistency kills the agent at random instants of its writes over many assignment steps on a
// real disk and restarts it after every kill. A kill is a durable-write step (write, fsync, rename,
// fsync-dir) that never returns: the goroutine is abandoned, so nothing after that instant happens — no
// deferred cleanup, no further write — exactly as with kill -9. After each restart: the meta files decode
// and name complete checkpoints, the kubelet's start config is a complete valid file, and no temporary file
// survives.
func TestCrashConsistency(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "dynamic-config")
	local := filepath.Join(root, "config.yaml")
	if err := os.WriteFile(local, []byte(cfgHeader+"eventRecordQPS: 50\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	poll.Drive(t, clk, 600*time.Millisecond) // health waits pass at once

	// Every payload ever sent, by resourceVersion: a checkpoint must hold exactly one of these.
	contents := map[string]string{}
	newAgent := func(kubelet *fakeKubelet) *Agent {
		return New(Config{
			Log: zap.NewNop(), Store: checkpoint.New(dir), Service: kubelet, Kubelet: kubelet, Clock: clk,
			LocalConfig: local, KubeletFlags: []string{}, Checker: kubeletcheck.InProcess{}, TrialDuration: time.Hour, HealthTimeout: 5 * time.Second,
			KeepCheckpoints: 2, TrialCheckInterval: time.Hour})
	}
	kubelet := &fakeKubelet{env: kubeletunit.New(dir), local: local, running: local}
	ag := newAgent(kubelet)
	if err := ag.Init(context.Background()); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(1, uint64(*crashSteps)))
	block := make(chan struct{}) // never closed: a blocked write is a dead process
	var kills int
	points := map[string]int{}
	var prev *dkcv1.Assignment
	for step := 0; step < *crashSteps; step++ {
		var a *dkcv1.Assignment
		switch r := rng.IntN(10); {
		case r < 5:
			rv := fmt.Sprint(step + 1)
			contents[rv] = cfgHeader + fmt.Sprintf("eventRecordQPS: %d\n", 1+step%90)
			a = assignment("u", rv, contents[rv])
		case r < 7:
			rv := fmt.Sprint(step + 1)
			contents[rv] = cfgHeader + "eventRecordQPS: -1\n"
			a = assignment("u", rv, contents[rv])
		case r < 8:
			a = &dkcv1.Assignment{}
		default:
			a = prev
		}
		if a == nil {
			a = &dkcv1.Assignment{}
		}
		prev = a

		// Die at the k-th durable step of this apply, if it gets that far.
		k := int64(1 + rng.IntN(12))
		var calls atomic.Int64
		killed := make(chan string, 1)
		durable.SetFault(func(st, path string) error {
			if calls.Add(1) == k {
				killed <- st + ":" + kind(dir, path)
				<-block
			}
			return nil
		})
		done := make(chan struct{})
		go func(ag *Agent) {
			ag.Apply(context.Background(), Desired{Assignment: a})
			close(done)
		}(ag)
		select {
		case <-done:
			durable.SetFault(nil)
			continue
		case point := <-killed:
			durable.SetFault(nil)
			kills++
			points[point]++
		case <-time.After(time.Minute):
			t.Fatalf("step %d: apply neither finished nor died", step)
		}

		// Restart: a new process, the kubelet still running whatever it was last restarted into.
		kubelet.mu.Lock()
		running := kubelet.running
		kubelet.mu.Unlock()
		kubelet = &fakeKubelet{env: kubeletunit.New(dir), local: local, running: running}
		ag = newAgent(kubelet)
		if err := ag.Init(context.Background()); err != nil {
			t.Fatalf("step %d: restart after a kill: %v", step, err)
		}
		checkInvariants(t, step, dir, local, contents)
	}
	t.Logf("%d steps, %d kills at %d distinct points: %v", *crashSteps, kills, len(points), points)
	if *crashSteps >= 1000 && (kills < 300 || len(points) < 8) {
		t.Errorf("too few kills (%d) or points (%d) to mean anything", kills, len(points))
	}
}

// kind names the file a durable step writes, for counting distinct kill points.
func kind(dir, path string) string {
	rel, err := filepath.Rel(dir, path)
	if err != nil {
		return path
	}
	switch {
	case strings.HasPrefix(rel, "checkpoints/"):
		return "checkpoint"
	default:
		return rel
	}
}

var invariantsMu sync.Mutex

func checkInvariants(t *testing.T, step int, dir, local string, contents map[string]string) {
	t.Helper()
	invariantsMu.Lock()
	defer invariantsMu.Unlock()
	s := checkpoint.New(dir)
	for name, read := range map[string]func() (*checkpointSource, error){
		"meta/assigned":        func() (*checkpointSource, error) { src, err := s.Assigned(); return wrap(src), err },
		"meta/last-known-good": func() (*checkpointSource, error) { src, err := s.LastKnownGood(); return wrap(src), err },
	} {
		src, err := read()
		if err != nil {
			t.Fatalf("step %d: %s does not decode after a kill: %v", step, name, err)
		}
		if src == nil {
			continue
		}
		files, err := s.Files(src.cm)
		if err != nil || files["kubelet"] != contents[src.cm.ResourceVersion] {
			t.Fatalf("step %d: %s names an incomplete checkpoint %s: %v", step, name, src.cm.ResourceVersion, err)
		}
	}
	start, err := kubeletunit.New(dir).Get()
	if err != nil {
		t.Fatalf("step %d: kubelet.env unreadable: %v", step, err)
	}
	if start == "" {
		start = local
	}
	if _, err := kubeletcheck.Load(context.Background(), start, nil); err != nil {
		t.Fatalf("step %d: the kubelet's start config %s is not a complete valid file: %v", step, start, err)
	}
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error {
		if strings.HasPrefix(filepath.Base(p), durable.TempPrefix) {
			t.Fatalf("step %d: temporary file survived a restart: %s", step, p)
		}
		return nil
	})
}

type checkpointSource struct {
	cm *corev1.ConfigMapNodeConfigSource
}

func wrap(src *corev1.NodeConfigSource) *checkpointSource {
	if src == nil || src.ConfigMap == nil {
		return nil
	}
	return &checkpointSource{cm: src.ConfigMap}
}
