// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// TestPhaseIsSavedAndExported: the agent's phase follows the rollback rules through a real agent — trial,
// promotion, rollback, local — and is in the state file (a restarted sidecar resumes from it) and in the
// dkc_sidecar_phase metric, 1 on the current phase only.
func TestPhaseIsSavedAndExported(t *testing.T) {
	n := newNode(t)
	reg := prometheus.NewRegistry()
	n.agent.metrics = NewMetrics(reg)
	check := func(want Phase) {
		t.Helper()
		if n.agent.phase != want {
			t.Errorf("phase %s, want %s", n.agent.phase, want)
		}
		if saved := savedPhase(t, n.dir); saved != string(want) {
			t.Errorf("state file phase %q, want %q", saved, want)
		}
		for _, p := range Phases {
			v := testutil.ToFloat64(n.agent.metrics.phase.WithLabelValues(string(p)))
			if (p == want) != (v == 1) {
				t.Errorf("dkc_sidecar_phase{phase=%q} = %v with phase %s", p, v, want)
			}
		}
	}
	n.agent.reconcile(context.Background())
	check(PhaseLocal)
	n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
	check(PhaseTrial)
	n.clock.Step(11 * time.Minute)
	n.agent.CheckTrial(context.Background())
	check(PhaseGood)
	n.apply(assignment("u", "2", cfgHeader+"maxPods: 13\n"), "")
	check(PhaseRolledBack)
	n.start()
	if n.agent.phase != PhaseRolledBack {
		t.Errorf("restarted sidecar resumes from phase %s, want %s", n.agent.phase, PhaseRolledBack)
	}
	n.agent.metrics = NewMetrics(prometheus.NewRegistry()) // the restarted sidecar's
	n.apply(&dkcv1.Assignment{}, "")                       // reset
	n.agent.reconcile(context.Background())
	check(PhaseLocal)
}

// TestStateFileWithoutPhase: a state file written by an older sidecar (no phase) loads as Unknown and keeps
// everything else; the next round records the phase beside the older fields.
func TestStateFileWithoutPhase(t *testing.T) {
	n := newNode(t)
	older := `{"kubeletFlags":[],"active":{},"incarnation":3,"nodeUID":"uid-1"}`
	if err := os.WriteFile(filepath.Join(n.dir, StateFileName), []byte(older), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start()
	if n.agent.phase != PhaseLocal {
		t.Errorf("phase %s after the first round, want %s", n.agent.phase, PhaseLocal)
	}
	if n.agent.nodeUID != "uid-1" || n.agent.state.s.Incarnation != 3 {
		t.Errorf("older fields lost: nodeUID %q, incarnation %d", n.agent.nodeUID, n.agent.state.s.Incarnation)
	}
	raw, err := os.ReadFile(filepath.Join(n.dir, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var saved map[string]any
	if err := json.Unmarshal(raw, &saved); err != nil || saved["phase"] != string(PhaseLocal) || saved["nodeUID"] != "uid-1" {
		t.Errorf("state file %s: want phase %s beside the older fields", raw, PhaseLocal)
	}
}

// savedPhase is the phase the state file in dir records.
func savedPhase(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var saved struct {
		Phase string `json:"phase"`
	}
	if err := json.Unmarshal(raw, &saved); err != nil {
		t.Fatalf("state file %s: %v", raw, err)
	}
	return saved.Phase
}

// TestRoundsThatCannotStartAreRetried: the two rows of the rollback rules decided before a round starts
// (docs/design.md): meta/assigned unreadable, or the kubelet's flags unknown. Nothing changes on the node,
// the status says internal failure, the next tick retries, and the phase is Retrying. The outcome's log line
// names what is retried: the assigned config the status reports, or "unknown" when meta/assigned itself
// cannot be read — never the local config as a stand-in.
func TestRoundsThatCannotStartAreRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		// prepare breaks the node after an assignment ran; it returns the agent's Config changes.
		prepare    func(t *testing.T, n *node) func(*Config)
		wantSource string
	}{
		{"kubelet flags unknown", func(t *testing.T, n *node) func(*Config) {
			n.kubelet.mu.Lock()
			n.kubelet.stopped = true
			n.kubelet.mu.Unlock()
			return func(c *Config) { c.KubeletFlags = nil } // never seen: the test's agents are given them
		}, "kube-system/c"},
		{"meta/assigned unreadable", func(t *testing.T, n *node) func(*Config) {
			if err := os.WriteFile(filepath.Join(n.dir, "meta", "assigned"), []byte("{{{ not a record"), 0o644); err != nil {
				t.Fatal(err)
			}
			return func(*Config) {}
		}, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			n.apply(assignment("u", "1", cfgHeader+"eventRecordQPS: 7\n"), "")
			n.expect("1", "1", "local", "", 1)
			change := tc.prepare(t, n)

			core, logs := observer.New(zap.InfoLevel)
			n.reporter = &recordingReporter{}
			cfg := n.agent.cfg
			cfg.Log, cfg.Reporter, cfg.Metrics = zap.New(core), n.reporter, nil
			change(&cfg)
			n.agent = New(cfg)
			if err := n.agent.Init(context.Background()); err != nil {
				t.Fatal(err)
			}
			if n.agent.phase != PhaseRetrying || !n.agent.retry {
				t.Errorf("phase %s, retry %v; want %s, true", n.agent.phase, n.agent.retry, PhaseRetrying)
			}
			st := n.reporter.lastStatus()
			if st.GetError() != string(nodeconfig.InternalError) || n.kubelet.count() != 1 {
				t.Errorf("status error %q after %d restarts; want %q after 1", st.GetError(), n.kubelet.count(), nodeconfig.InternalError)
			}
			outcomes := logs.FilterMessage("kubelet config outcome").All()
			if len(outcomes) != 1 {
				t.Fatalf("%d outcome log lines, want 1", len(outcomes))
			}
			source := outcomes[0].ContextMap()["source"]
			if source != tc.wantSource {
				t.Errorf("outcome logged with source %v, want %s", source, tc.wantSource)
			}
			if cm := st.GetAssigned().GetConfigMap(); cm != nil && source != cm.GetNamespace()+"/"+cm.GetName() {
				t.Errorf("outcome logged with source %v; the status says %s/%s is assigned", source, cm.GetNamespace(), cm.GetName())
			}
		})
	}
}
